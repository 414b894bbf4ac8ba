// y = x @ W.T for float32 activations and a weight kept in GGML's 32-value blocks (Q4_0, Q4_1, Q8_0).
//
// The weight arrives repacked (backend/executor/block_kernel.py): quants [out, in / 2] (Q4, GGML's nibble
// order: low nibbles are a block's first 16 values) or [out, in] (Q8_0, int8), and the file's float16 scales
// d (and Q4_1's minimums m) as [out, in / 32]. Each block is dequantized exactly, to the float32 values the
// file holds (q * d for Q8_0, (q - 8) * d for Q4_0, q * d + m for Q4_1: each product is exact in float32),
// and multiplied with float32 FMAs, so the result equals F.linear(x, dequantized) up to summation order.
// Few activation rows (decode) share each dequantized block, 8 at a time; many rows (prefill, big batches) run
// as a GEMM: 16 output rows are dequantized once into a k-major panel, and tiles of 6 activation rows are
// multiplied with it by broadcast and FMA into 6 x 2 vector accumulators. Products use torch's threads.
// An AVX2+FMA+F16C path is chosen at run time; a scalar path runs elsewhere. Nothing needs AVX-512.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "block_format.h"
#include "model_ops.h"

namespace {

using namespace tidegate_blocks;

constexpr int64_t kRowGroup = 15;  // output rows multiplied together on the few-rows path
constexpr int64_t kManyRows = kFewRows + 1;  // past one few-rows tile the GEMM costs less per row (docs/benchmarks.md)

void rows_scalar(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features,
                 int64_t begin, int64_t end) {
  float block[kBlock];
  for (int64_t o = begin; o < end; ++o) {
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
      for (int64_t r = 0; r < tile; ++r) y[(r0 + r) * out_features + o] = acc[r];
    }
  }
}

#if defined(__x86_64__)
// One output row against a tile of R activation rows; A accumulators per row keep enough FMAs in flight.
template <int R>
AVX2_TARGET void tile_avx2(const Matrix& w, int64_t o, const float* x, float* y, int64_t out_features) {
  constexpr int A = R <= 2 ? 4 : (R <= 4 ? 2 : 1);
  __m256 acc[R][A];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
  __m256 v[4];
  for (int64_t b = 0; b < w.blocks(); ++b) {
    dequantize_block_avx2(w, o, b, v);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * w.in + b * kBlock;
      for (int i = 0; i < 4; ++i) acc[r][i % A] = _mm256_fmadd_ps(v[i], _mm256_loadu_ps(xr + 8 * i), acc[r][i % A]);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 total = acc[r][0];
    for (int a = 1; a < A; ++a) total = _mm256_add_ps(total, acc[r][a]);
    y[r * out_features + o] = hsum(total);
  }
}

using FewTile = void (*)(const Matrix&, int64_t, const float*, float*, int64_t);
constexpr FewTile kFewTiles[kFewRows + 1] = {nullptr, tile_avx2<1>, tile_avx2<2>, tile_avx2<3>, tile_avx2<4>,
                                          tile_avx2<5>, tile_avx2<6>, tile_avx2<7>, tile_avx2<8>};

AVX2_TARGET void dequantize_rows_avx2(const Matrix& w, float* out, int64_t begin, int64_t end) {
  __m256 v[4];
  for (int64_t o = begin; o < end; ++o)
    for (int64_t b = 0; b < w.blocks(); ++b) {
      dequantize_block_avx2(w, o, b, v);
      float* dst = out + (o - begin) * w.in + b * kBlock;
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + 8 * i, v[i]);
    }
}

// Few rows: output rows in groups of kRowGroup against each activation tile in turn, the group's quantized
// rows and the tile staying in L1 while every pair is multiplied.
AVX2_TARGET void few_rows_avx2(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features,
                               int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; g += kRowGroup)
    for (int64_t r0 = 0; r0 < rows; r0 += kFewRows)
      for (int64_t o = g; o < std::min(end, g + kRowGroup); ++o)
        kFewTiles[std::min(kFewRows, rows - r0)](w, o, x + r0 * w.in, y + r0 * out_features, out_features);
}

#endif

Matrix matrix_of(const torch::Tensor& quants, const torch::Tensor& scales, const c10::optional<torch::Tensor>& mins,
                 int64_t kind) {
  TORCH_CHECK(kind >= Q4_0 && kind <= Q8_0, "unknown block kind ", kind);
  TORCH_CHECK(quants.dtype() == torch::kUInt8 && quants.is_contiguous() && quants.dim() == 2, "quants: uint8 [out, bytes]");
  TORCH_CHECK(scales.dtype() == torch::kFloat16 && scales.is_contiguous(), "scales: float16 [out, in / 32]");
  const int64_t in = scales.size(1) * kBlock;
  Matrix w{quants.data_ptr<uint8_t>(), scales.data_ptr<c10::Half>(), nullptr, in, static_cast<Kind>(kind)};
  TORCH_CHECK(quants.size(1) == w.row_bytes() && scales.size(0) == quants.size(0), "quants and scales disagree");
  if (w.kind == Q4_1) {
    TORCH_CHECK(mins.has_value() && mins->dtype() == torch::kFloat16 && mins->is_contiguous() &&
                mins->sizes() == scales.sizes(), "Q4_1 needs mins shaped as scales");
    w.mins = mins->data_ptr<c10::Half>();
  }
  return w;
}

// The grain keeps each task a few hundred microseconds of work at least: small matrices stay on one thread.
int64_t grain_for(int64_t in, int64_t rows) { return std::max<int64_t>(1, 65536 / (in * std::max<int64_t>(rows, 1))); }

// The rows quantized to T, into scratch kept per calling thread (a decode step makes a hundred products).
template <typename T>
QuantizedRows<T> quantize_rows(const float* x, int64_t rows, int64_t in, bool avx2) {
  thread_local std::vector<T> q;
  thread_local std::vector<float> d, s;
  q.resize(rows * in);
  d.resize(rows * in / kBlock);
  s.resize(rows * in / kBlock);
  const QuantizedRows<T> out{q.data(), d.data(), s.data()};
#if defined(__x86_64__)
  if (avx2) {
    quantize_rows_avx2(x, rows, in, out);
    return out;
  }
#endif
  quantize_rows_scalar(x, rows, in, out);
  return out;
}

template <typename T>
void multiply_integer(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features, bool avx2) {
  const QuantizedRows<T> xq = quantize_rows<T>(x, rows, w.in, avx2);
  at::parallel_for(0, out_features, grain_for(w.in, rows), [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
    if (avx2) return integer_rows_avx2(w, xq, rows, y, out_features, begin, end);
#endif
    integer_rows_scalar(w, xq, rows, y, out_features, begin, end);
  });
}

// Threads split the output rows (few activation rows) or the panels of kPanel output rows (many). With
// `activation_bits` 8 or 16, 1 to kFewRows rows are quantized once and multiplied in integer dot products
// (block_integer_dot.cpp); 32 (float32, exact) and more rows take the float32 paths.
void multiply(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features, int64_t activation_bits) {
  const bool avx2 = use_avx2();
  if (activation_bits != 32 && rows >= 1 && rows <= kFewRows) {
    if (activation_bits == 8) return multiply_integer<int8_t>(w, x, rows, y, out_features, avx2);
    return multiply_integer<int16_t>(w, x, rows, y, out_features, avx2);
  }
#if defined(__x86_64__)
  if (avx2 && rows >= kManyRows) {
    const int64_t panels = (out_features + kPanel - 1) / kPanel;
    at::parallel_for(0, panels, grain_for(w.in * kPanel, rows), [&](int64_t begin, int64_t end) {
      many_rows_avx2(w, x, rows, y, out_features, begin, end);
    });
    return;
  }
#endif
  at::parallel_for(0, out_features, grain_for(w.in, rows), [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
    if (avx2) return few_rows_avx2(w, x, rows, y, out_features, begin, end);
#endif
    rows_scalar(w, x, rows, y, out_features, begin, end);
  });
}

torch::Tensor block_linear(const torch::Tensor& x, const torch::Tensor& quants, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& mins, int64_t kind, int64_t activation_bits) {
  const Matrix w = matrix_of(quants, scales, mins, kind);
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) == w.in, "x: float32 [rows, in]");
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16 || activation_bits == 32, "activation bits: 8, 16 or 32");
  const torch::Tensor xc = x.contiguous();
  const int64_t rows = xc.size(0), out_features = quants.size(0);
  torch::Tensor y = torch::empty({rows, out_features}, xc.options());
  multiply(w, xc.data_ptr<float>(), rows, y.data_ptr<float>(), out_features, activation_bits);
  return y;
}

// The rows of x as the integer path quantizes them: values [rows, in] (int8 or int16), and per 32 values
// the scale and scale * sum [rows, in / 32].
template <typename T>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantized_tensors(const torch::Tensor& x, c10::ScalarType type) {
  const int64_t rows = x.size(0), in = x.size(1);
  const QuantizedRows<T> quantized = quantize_rows<T>(x.data_ptr<float>(), rows, in, use_avx2());
  torch::Tensor q = torch::empty({rows, in}, torch::TensorOptions().dtype(type));
  torch::Tensor d = torch::empty({rows, in / kBlock}, torch::TensorOptions().dtype(torch::kFloat32));
  torch::Tensor s = torch::empty_like(d);
  std::copy(quantized.q, quantized.q + q.numel(), q.data_ptr<T>());
  std::copy(quantized.d, quantized.d + d.numel(), d.data_ptr<float>());
  std::copy(quantized.s, quantized.s + s.numel(), s.data_ptr<float>());
  return {q, d, s};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_activations(const torch::Tensor& x, int64_t bits) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) % kBlock == 0, "x: float32 [rows, 32 k]");
  TORCH_CHECK(bits == 8 || bits == 16, "activation bits: 8 or 16");
  const torch::Tensor xc = x.contiguous();
  return bits == 8 ? quantized_tensors<int8_t>(xc, torch::kInt8) : quantized_tensors<int16_t>(xc, torch::kInt16);
}

// Output rows [begin, end) of the weight as float32 [end - begin, in], the file's values exactly.
torch::Tensor dequantize(const torch::Tensor& quants, const torch::Tensor& scales,
                         const c10::optional<torch::Tensor>& mins, int64_t kind, int64_t begin, int64_t end) {
  const Matrix w = matrix_of(quants, scales, mins, kind);
  TORCH_CHECK(0 <= begin && begin <= end && end <= quants.size(0), "row range out of bounds");
  torch::Tensor out = torch::empty({end - begin, w.in}, torch::TensorOptions().dtype(torch::kFloat32));
  float* op = out.data_ptr<float>();
  const bool avx2 = use_avx2();
  at::parallel_for(begin, end, grain_for(w.in, 1), [&](int64_t b0, int64_t b1) {
#if defined(__x86_64__)
    if (avx2) return dequantize_rows_avx2(w, op + (b0 - begin) * w.in, b0, b1);
#endif
    for (int64_t o = b0; o < b1; ++o)
      for (int64_t b = 0; b < w.blocks(); ++b) dequantize_block_scalar(w, o, b, op + (o - begin) * w.in + b * kBlock);
  });
  return out;
}

}  // namespace

torch::Tensor tidegate_ops::block_linear(const torch::Tensor& x, const torch::Tensor& quants,
                                         const torch::Tensor& scales, const c10::optional<torch::Tensor>& mins,
                                         int64_t kind, int64_t activation_bits) {
  return ::block_linear(x, quants, scales, mins, kind, activation_bits);
}

// The products run without the GIL, as torch's own ops do, so that the server's event loop keeps going meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto no_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("linear", &block_linear, "y = x @ W.T for a weight in GGML blocks (1-8 rows: 8- or 16-bit activations if asked)",
        no_gil);
  m.def("quantize_activations", &quantize_activations, "rows as the integer path quantizes them (tests)");
  m.def("dequantize", &dequantize, "rows of a weight in GGML blocks as float32", no_gil);
  m.def("uses_avx2", &use_avx2, "whether the AVX2+FMA+F16C path runs on this CPU");
  m.def("set_scalar_only", &set_scalar_only, "run the portable paths of every kernel even where AVX2 is there (tests)");
  tidegate_ops::bind_decode_stack(m);
}
