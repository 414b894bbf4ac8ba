// y = x @ W.T for float32 activations and a weight kept in GGML's 32-value blocks (Q4_0, Q4_1, Q8_0).
//
// The weight arrives repacked (backend/executor/block_linear.py) in the interleaved layout of block_format.h:
// output rows in groups of 8, each block's quant bytes of a group's rows alternating in 2-byte units, and the
// file's float16 scales d (and Q4_1's minimums m) as [groups][blocks][8]. The values are the file's: a block
// dequantized here is exactly what the file holds (q * d for Q8_0, (q - 8) * d for Q4_0, q * d + m for Q4_1:
// each product is exact in float32). Decode products (1 to 8 rows, 8- or 16-bit activations) multiply in
// integers (block_integer_dot.cpp); float32 products run as a GEMM (block_gemm.cpp): 16 output rows dequantized
// once into a k-major panel, tiles of up to 6 activation rows multiplied with it by broadcast and FMA, so the
// result equals F.linear(x, dequantized) up to summation order. Products use torch's threads. An
// AVX2+FMA+F16C path is chosen at run time; a scalar path runs elsewhere. Nothing needs AVX-512, but where the
// CPU has AVX-512 VNNI, many rows with 8- or 16-bit activations run as an integer GEMM (block_gemm.cpp).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "block_format.h"
#include "k_blocks.h"
#include "model_ops.h"

namespace {

using namespace tidegate_blocks;

// Each block dequantized once for up to kFewRows activation rows.
void rows_scalar(const Matrix& w, const float* x, int64_t rows, float* y, int64_t begin, int64_t end) {
  float block[kBlock];
  for (int64_t o = begin; o < end; ++o)
    for (int64_t r0 = 0; r0 < rows; r0 += kFewRows) {
      const int64_t tile = std::min(kFewRows, rows - r0);
      float acc[kFewRows] = {};
      for (int64_t b = 0; b < w.blocks(); ++b) {
        dequantize_block_scalar(w, o, b, block);
        for (int64_t r = 0; r < tile; ++r) {
          const float* xr = x + (r0 + r) * w.in + b * kBlock;
          float sum = 0.0f;
          for (int j = 0; j < kBlock; ++j) sum += block[j] * xr[j];
          acc[r] += sum;
        }
      }
      for (int64_t r = 0; r < tile; ++r) y[(r0 + r) * w.out + o] = acc[r];
    }
}

#if defined(__x86_64__)
// The 8 2-byte units of one row's block in a group (16 bytes apart): the block's 16 bytes in order.
AVX2_TARGET inline __m128i gather_units(const uint8_t* p) {
  uint16_t u[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&u[i], p + i * 2 * kGroup, sizeof u[i]);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
}

// Row o of the matrix, dequantized exactly into out [in].
AVX2_TARGET void dequantize_row_avx2(const Matrix& w, int64_t o, float* out) {
  for (int64_t b = 0; b < w.blocks(); ++b, out += kBlock) {
    if (w.kind == Q5_0) {  // embedding lookups only: the products dequantize whole groups
      dequantize_block_scalar(w, o, b, out);
      continue;
    }
    const uint8_t* q = w.group_block(o / kGroup, b) + (o % kGroup) * 2;
    const __m256 d = _mm256_set1_ps(half_to_float(w.scales[w.scale_index(o, b)]));
    const __m256 m = _mm256_set1_ps(w.kind == Q4_1 ? half_to_float(w.mins[w.scale_index(o, b)]) : 0.0f);
    __m128i bytes[2];  // the block's 32 values as signed bytes, in order
    if (w.kind == Q8_0) {
      bytes[0] = gather_units(q);
      bytes[1] = gather_units(q + 8 * 2 * kGroup);
    } else {
      const Nibbles values = split_nibbles(gather_units(q), w.kind);
      bytes[0] = values.low;
      bytes[1] = values.high;
    }
    for (int i = 0; i < 4; ++i) {
      const __m128i part = i % 2 == 0 ? bytes[i / 2] : _mm_srli_si128(bytes[i / 2], 8);
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
      _mm256_storeu_ps(out + 8 * i, w.kind == Q4_1 ? _mm256_fmadd_ps(v, d, m) : _mm256_mul_ps(v, d));
    }
  }
}
#endif

Matrix matrix_of(const torch::Tensor& quants, const torch::Tensor& scales, const c10::optional<torch::Tensor>& mins,
                 int64_t kind, int64_t out_features) {
  TORCH_CHECK(is_block_kind(kind), "unknown block kind ", kind);
  TORCH_CHECK(quants.dtype() == torch::kUInt8 && quants.is_contiguous() && quants.dim() == 2,
              "quants: uint8 [groups, 8 * row bytes]");
  TORCH_CHECK(scales.dtype() == torch::kFloat16 && scales.is_contiguous() && scales.dim() == 2,
              "scales: float16 [groups, 8 * in / 32]");
  const int64_t in = scales.size(1) / kGroup * kBlock;
  Matrix w{quants.data_ptr<uint8_t>(), scales.data_ptr<c10::Half>(), nullptr, in, out_features, static_cast<Kind>(kind)};
  TORCH_CHECK(out_features >= 0 && quants.size(0) == w.groups() && scales.size(0) == w.groups() &&
              quants.size(1) == kGroup * w.blocks() * w.block_bytes() && scales.size(1) == kGroup * w.blocks(),
              "quants and scales disagree with ", out_features, " output rows");
  if (w.kind == Q4_1) {
    TORCH_CHECK(mins.has_value() && mins->dtype() == torch::kFloat16 && mins->is_contiguous() &&
                mins->sizes() == scales.sizes(), "Q4_1 needs mins shaped as scales");
    w.mins = mins->data_ptr<c10::Half>();
  }
  return w;
}

// The grain keeps each task a few hundred microseconds of work at least: small matrices stay on one thread.
int64_t grain_for(int64_t in, int64_t rows) { return std::max<int64_t>(1, 65536 / (in * std::max<int64_t>(rows, 1))); }

constexpr int64_t kQuantizeGrain = 16;  // rows a thread quantizes at least: a decode step's stay on the caller

// The rows quantized, into scratch kept per calling thread (a decode step makes a hundred products); a prefill's
// many rows split over threads.
QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t in, int64_t bits, bool avx2) {
  thread_local std::vector<int16_t> q;
  thread_local std::vector<float> d, s;
  const int64_t blocks = in / kBlock;
  q.resize(rows * in);
  d.resize(rows * blocks);
  s.resize(rows * blocks);
  const QuantizedRows out{q.data(), d.data(), s.data()};
  const float levels = bits == 8 ? 127.0f : 32767.0f;  // the largest |q| of a block
  at::parallel_for(0, rows, kQuantizeGrain, [&](int64_t begin, int64_t end) {
    const QuantizedRows part{out.q + begin * in, out.d + begin * blocks, out.s + begin * blocks};
#if defined(__x86_64__)
    if (avx2) return quantize_rows_avx2(x + begin * in, end - begin, in, levels, part);
#endif
    quantize_rows_scalar(x + begin * in, end - begin, in, levels, part);
  });
  return out;
}

#if defined(__x86_64__)
// Many rows with 8- or 16-bit activations on AVX-512 VNNI (block_gemm.cpp): quantized as the decode path does,
// then the wide panels split over threads.
void many_rows_integer(const Matrix& w, const float* x, int64_t rows, float* y, int64_t bits) {
  const QuantizedRows xq = quantize_rows(x, rows, w.in, bits, true);
  const int8_t* x8 = nullptr;
  if (bits == 8) {  // vpdpbusd reads bytes
    thread_local std::vector<int8_t> narrow;
    narrow.resize(rows * w.in);
    int8_t* out = narrow.data();  // named here: inside the loop `narrow` would be each worker's own
    at::parallel_for(0, rows, kQuantizeGrain, [&](int64_t begin, int64_t end) {
      narrow_to_int8(xq.q + begin * w.in, (end - begin) * w.in, out + begin * w.in);
    });
    x8 = out;
  }
  const int64_t panels = (w.out + kWidePanel - 1) / kWidePanel;
  at::parallel_for(0, panels, grain_for(w.in * kWidePanel, rows), [&](int64_t begin, int64_t end) {
    many_rows_vnni(w, xq, x8, rows, y, begin, end);
  });
}
#endif

// With `activation_bits` 8 or 16, 1 to kFewRows rows are quantized once and multiplied in integer dot products,
// threads splitting the groups of output rows, and so are more rows on AVX-512 VNNI (as an integer GEMM); 32
// (float32, exact) and elsewhere more rows run as the float32 GEMM, threads splitting its panels.
void multiply(const Matrix& w, const float* x, int64_t rows, float* y, int64_t activation_bits) {
  const bool avx2 = use_avx2();
  if (rows == 0) return;
#if defined(__x86_64__)
  if (activation_bits != 32 && rows > kFewRows && use_avx512_vnni())
    return many_rows_integer(w, x, rows, y, activation_bits);
#endif
  if (activation_bits != 32 && rows <= kFewRows) {
    const QuantizedRows xq = quantize_rows(x, rows, w.in, activation_bits, avx2);
    at::parallel_for(0, w.groups(), std::max<int64_t>(1, grain_for(w.in, rows) / kGroup), [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
      if (avx2) return integer_rows_avx2(w, xq, rows, y, begin, end);
#endif
      integer_rows_scalar(w, xq, rows, y, begin, end);
    });
    return;
  }
#if defined(__x86_64__)
  if (avx2) {
    const int64_t panels = (w.out + kPanel - 1) / kPanel;
    at::parallel_for(0, panels, grain_for(w.in * kPanel, rows), [&](int64_t begin, int64_t end) {
      many_rows_avx2(w, x, rows, y, begin, end);
    });
    return;
  }
#endif
  at::parallel_for(0, w.out, grain_for(w.in, rows), [&](int64_t begin, int64_t end) {
    rows_scalar(w, x, rows, y, begin, end);
  });
}

torch::Tensor block_linear(const torch::Tensor& x, const torch::Tensor& quants, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& mins, int64_t kind, int64_t activation_bits,
                           int64_t out_features) {
  if (tidegate_k::is_k_kind(kind)) return tidegate_ops::k_linear(x, quants, kind, activation_bits, out_features);  // k_blocks.cpp
  const Matrix w = matrix_of(quants, scales, mins, kind, out_features);
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) == w.in, "x: float32 [rows, in]");
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16 || activation_bits == 32, "activation bits: 8, 16 or 32");
  const torch::Tensor xc = x.contiguous();
  torch::Tensor y = torch::empty({xc.size(0), out_features}, xc.options());
  multiply(w, xc.data_ptr<float>(), xc.size(0), y.data_ptr<float>(), activation_bits);
  return y;
}

// The rows of x as the integer path quantizes them: values [rows, in] (int8 or int16), and per 32 values
// the scale and scale * sum [rows, in / 32].
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_activations(const torch::Tensor& x, int64_t bits) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) % kBlock == 0, "x: float32 [rows, 32 k]");
  TORCH_CHECK(bits == 8 || bits == 16, "activation bits: 8 or 16");
  const torch::Tensor xc = x.contiguous();
  const int64_t rows = xc.size(0), in = xc.size(1);
  const QuantizedRows quantized = quantize_rows(xc.data_ptr<float>(), rows, in, bits, use_avx2());
  torch::Tensor q = torch::empty({rows, in}, torch::TensorOptions().dtype(torch::kInt16));
  torch::Tensor d = torch::empty({rows, in / kBlock}, torch::TensorOptions().dtype(torch::kFloat32));
  torch::Tensor s = torch::empty_like(d);
  std::copy(quantized.q, quantized.q + q.numel(), q.data_ptr<int16_t>());
  std::copy(quantized.d, quantized.d + d.numel(), d.data_ptr<float>());
  std::copy(quantized.s, quantized.s + s.numel(), s.data_ptr<float>());
  return {bits == 8 ? q.to(torch::kInt8) : q, d, s};
}

// Output rows `ids` of the weight as float32 [len(ids), in], the file's values exactly.
torch::Tensor dequantize(const torch::Tensor& quants, const torch::Tensor& scales,
                         const c10::optional<torch::Tensor>& mins, int64_t kind, int64_t out_features,
                         const torch::Tensor& ids) {
  if (tidegate_k::is_k_kind(kind)) return tidegate_ops::k_dequantize(quants, kind, out_features, ids);
  const Matrix w = matrix_of(quants, scales, mins, kind, out_features);
  const torch::Tensor rows = ids.to(torch::kInt64).contiguous();
  TORCH_CHECK(rows.dim() == 1, "ids: one dimension");
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t n = rows.numel();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(row[i] >= 0 && row[i] < out_features, "row ", row[i], " out of bounds");
  torch::Tensor out = torch::empty({n, w.in}, torch::TensorOptions().dtype(torch::kFloat32));
  float* op = out.data_ptr<float>();
  const bool avx2 = use_avx2();
  at::parallel_for(0, n, grain_for(w.in, 1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
#if defined(__x86_64__)
      if (avx2) {
        dequantize_row_avx2(w, row[i], op + i * w.in);
        continue;
      }
#endif
      for (int64_t b = 0; b < w.blocks(); ++b) dequantize_block_scalar(w, row[i], b, op + i * w.in + b * kBlock);
    }
  });
  return out;
}

}  // namespace

torch::Tensor tidegate_ops::block_linear(const torch::Tensor& x, const torch::Tensor& quants,
                                         const torch::Tensor& scales, const c10::optional<torch::Tensor>& mins,
                                         int64_t kind, int64_t activation_bits, int64_t out_features) {
  return ::block_linear(x, quants, scales, mins, kind, activation_bits, out_features);
}

// The products run without the GIL, as torch's own ops do, so that the server's event loop keeps going meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto no_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("linear", &block_linear, "y = x @ W.T for a weight in interleaved GGML blocks (1-8 rows: 8- or 16-bit activations if asked)",
        no_gil);
  m.def("quantize_activations", &quantize_activations, "rows as the integer path quantizes them (tests)");
  m.def("dequantize", &dequantize, "rows `ids` of a weight in interleaved GGML blocks as float32", no_gil);
  m.def("uses_avx2", &use_avx2, "whether the AVX2+FMA+F16C path runs on this CPU");
  m.def("set_scalar_only", &set_scalar_only, "run the portable paths of every kernel even where AVX2 is there (tests)");
  m.def("uses_avx512_vnni", &use_avx512_vnni,
        "whether products of many rows with 8- or 16-bit activations run on AVX-512 VNNI on this CPU");
  m.def("set_isa", [](const std::string& isa) {
    TORCH_CHECK(isa == "scalar" || isa == "avx2" || isa == "avx512", "isa: scalar, avx2 or avx512");
    set_isa_limit(isa == "scalar" ? kScalar : isa == "avx2" ? kAvx2 : kAvx512Vnni);
  }, "the widest instruction set every kernel may use, capped at the CPU's (tests, benchmarks)");
  tidegate_ops::bind_decode_stack(m);
  tidegate_ops::bind_k_blocks(m);
}
