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
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

enum Kind : int64_t { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };
constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 8;  // activation rows that share one dequantized block
constexpr int64_t kRowGroup = 15;  // output rows multiplied together on the few-rows path
constexpr int64_t kManyRows = kTile + 1;  // past one few-rows tile the GEMM costs less per row (docs/benchmarks.md)
constexpr int64_t kPanel = 16;  // output rows of a dequantized panel: two 8-float vectors at each k
constexpr int64_t kRowTile = 6;  // activation rows per GEMM tile: 6 x 2 accumulators, 15 of 16 ymm registers in use
constexpr int64_t kGroupBytes = 192 * 1024;  // panels dequantized together, sized to stay in a 512 KB L2

struct Matrix {
  const uint8_t* quants;
  const c10::Half* scales;
  const c10::Half* mins;  // Q4_1 only
  int64_t in;
  Kind kind;

  int64_t blocks() const { return in / kBlock; }
  int64_t row_bytes() const { return kind == Q8_0 ? in : in / 2; }
};

// The 32 float32 values of block b of output row o.
void dequantize_block_scalar(const Matrix& w, int64_t o, int64_t b, float* out) {
  const int64_t nb = w.blocks();
  const float d = static_cast<float>(w.scales[o * nb + b]);
  const uint8_t* q = w.quants + o * w.row_bytes() + b * (w.kind == Q8_0 ? kBlock : kBlock / 2);
  if (w.kind == Q8_0) {
    for (int j = 0; j < kBlock; ++j) out[j] = static_cast<float>(static_cast<int8_t>(q[j])) * d;
    return;
  }
  const float m = w.kind == Q4_1 ? static_cast<float>(w.mins[o * nb + b]) : 0.0f;
  const int offset = w.kind == Q4_0 ? 8 : 0;
  for (int j = 0; j < kBlock / 2; ++j) {
    out[j] = static_cast<float>((q[j] & 15) - offset) * d + m;
    out[j + 16] = static_cast<float>((q[j] >> 4) - offset) * d + m;
  }
}

void rows_scalar(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features,
                 int64_t begin, int64_t end) {
  float block[kBlock];
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int64_t tile = std::min(kTile, rows - r0);
      float acc[kTile] = {};
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
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

AVX2_TARGET inline float half_to_float(c10::Half h) { return _cvtsh_ss(h.x); }

AVX2_TARGET inline void dequantize_block_avx2(const Matrix& w, int64_t o, int64_t b, __m256 v[4]) {
  const int64_t nb = w.blocks();
  const __m256 d = _mm256_set1_ps(half_to_float(w.scales[o * nb + b]));
  __m128i parts[4];
  if (w.kind == Q8_0) {
    const uint8_t* q = w.quants + o * w.row_bytes() + b * kBlock;
    for (int i = 0; i < 4; ++i) parts[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i));
  } else {
    const uint8_t* q = w.quants + o * w.row_bytes() + b * (kBlock / 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i low4 = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(raw, low4);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    if (w.kind == Q4_0) {
      lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
    }
    parts[0] = lo;
    parts[1] = _mm_srli_si128(lo, 8);
    parts[2] = hi;
    parts[3] = _mm_srli_si128(hi, 8);
  }
  for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]));
  if (w.kind == Q4_1) {
    const __m256 m = _mm256_set1_ps(half_to_float(w.mins[o * nb + b]));
    for (int i = 0; i < 4; ++i) v[i] = _mm256_fmadd_ps(v[i], d, m);  // q * d is exact: one rounding, as q * d + m
  } else {
    for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(v[i], d);
  }
}

AVX2_TARGET inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

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
constexpr FewTile kFewTiles[kTile + 1] = {nullptr, tile_avx2<1>, tile_avx2<2>, tile_avx2<3>, tile_avx2<4>,
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

// r[j] holds 8 values of row j; afterwards r[k] holds value k of every row.
AVX2_TARGET inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// Output rows [o, o + kPanel) dequantized k-major: panel[k * kPanel + j] is weight (o + j, k); rows past
// out_features are zeros. A k step of the GEMM then reads kPanel consecutive weights: two vector loads.
AVX2_TARGET void dequantize_panel_avx2(const Matrix& w, int64_t o, int64_t out_features, float* panel) {
  alignas(32) float rows8[8][kBlock];  // one block of 8 output rows, staged in L1 rather than in 32 registers
  __m256 v[4], cols[8];
  for (int64_t b = 0; b < w.blocks(); ++b)
    for (int half = 0; half < kPanel / 8; ++half) {
      for (int j = 0; j < 8; ++j) {
        const int64_t row = o + 8 * half + j;
        if (row < out_features) {
          dequantize_block_avx2(w, row, b, v);
        } else {
          for (int i = 0; i < 4; ++i) v[i] = _mm256_setzero_ps();
        }
        for (int i = 0; i < 4; ++i) _mm256_store_ps(rows8[j] + 8 * i, v[i]);
      }
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 8; ++j) cols[j] = _mm256_load_ps(rows8[j] + 8 * i);
        transpose8(cols);
        float* dst = panel + (b * kBlock + 8 * i) * kPanel + 8 * half;
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(dst + k * kPanel, cols[k]);
      }
    }
}

// R activation rows times one panel: each x[r, k] is broadcast against the panel's two vectors at k, so the
// 2R accumulators hold kPanel consecutive outputs of each row and no horizontal sum is needed.
template <int R>
AVX2_TARGET void panel_tile_avx2(const float* panel, const float* x, int64_t in, float* y, int64_t out_features,
                                 int64_t valid) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < in; ++k) {
    const __m256 p0 = _mm256_loadu_ps(panel + k * kPanel), p1 = _mm256_loadu_ps(panel + k * kPanel + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * in + k);
      acc[r][0] = _mm256_fmadd_ps(p0, xb, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(p1, xb, acc[r][1]);
    }
  }
  alignas(32) float last[kPanel];  // a panel past the last output row: only `valid` outputs are stored
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* out = valid == kPanel ? y + r * out_features : last;
    _mm256_storeu_ps(out, acc[r][0]);
    _mm256_storeu_ps(out + 8, acc[r][1]);
    if (out == last) std::copy(last, last + valid, y + r * out_features);
  }
}

using PanelTile = void (*)(const float*, const float*, int64_t, float*, int64_t, int64_t);
constexpr PanelTile kPanelTiles[kRowTile + 1] = {nullptr, panel_tile_avx2<1>, panel_tile_avx2<2>, panel_tile_avx2<3>,
                                                 panel_tile_avx2<4>, panel_tile_avx2<5>, panel_tile_avx2<6>};

// Many rows, as a GEMM: the thread's panels [begin, end) are dequantized a group at a time into a scratch that
// stays in L2, and every tile of kRowTile activation rows (in L1) runs through each panel of the group.
AVX2_TARGET void many_rows_avx2(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features,
                                int64_t begin, int64_t end) {
  const int64_t panel_values = kPanel * w.in;
  const int64_t group = std::max<int64_t>(1, kGroupBytes / (panel_values * int64_t{sizeof(float)}));
  std::vector<float> scratch(group * panel_values);
  for (int64_t g = begin; g < end; g += group) {
    const int64_t panels = std::min(end, g + group) - g;
    for (int64_t p = 0; p < panels; ++p)
      dequantize_panel_avx2(w, (g + p) * kPanel, out_features, scratch.data() + p * panel_values);
    for (int64_t r0 = 0, tile = 0; r0 < rows; r0 += tile) {
      const int64_t left = rows - r0;
      tile = left > kRowTile && left < 2 * kRowTile ? (left + 1) / 2 : std::min(kRowTile, left);  // no 1- or 2-row tail
      const float* xt = x + r0 * w.in;
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t o = (g + p) * kPanel;
        kPanelTiles[tile](scratch.data() + p * panel_values, xt, w.in, y + r0 * out_features + o, out_features,
                          std::min(kPanel, out_features - o));
      }
    }
  }
}

// Few rows: output rows in groups of kRowGroup against each activation tile in turn, the group's quantized
// rows and the tile staying in L1 while every pair is multiplied.
AVX2_TARGET void few_rows_avx2(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features,
                               int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; g += kRowGroup)
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t o = g; o < std::min(end, g + kRowGroup); ++o)
        kFewTiles[std::min(kTile, rows - r0)](w, o, x + r0 * w.in, y + r0 * out_features, out_features);
}

#endif

std::atomic<bool> scalar_only{false};  // set by tests, so that the portable path runs on AVX2 machines too

bool use_avx2() {
#if defined(__x86_64__)
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return supported && !scalar_only.load();
#else
  return false;
#endif
}

void set_scalar_only(bool value) { scalar_only.store(value); }

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

// Threads split the output rows (few activation rows) or the panels of kPanel output rows (many).
void multiply(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features) {
#if defined(__x86_64__)
  if (use_avx2() && rows >= kManyRows) {
    const int64_t panels = (out_features + kPanel - 1) / kPanel;
    at::parallel_for(0, panels, grain_for(w.in * kPanel, rows), [&](int64_t begin, int64_t end) {
      many_rows_avx2(w, x, rows, y, out_features, begin, end);
    });
    return;
  }
#endif
  const bool avx2 = use_avx2();
  at::parallel_for(0, out_features, grain_for(w.in, rows), [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
    if (avx2) return few_rows_avx2(w, x, rows, y, out_features, begin, end);
#endif
    rows_scalar(w, x, rows, y, out_features, begin, end);
  });
}

torch::Tensor block_linear(const torch::Tensor& x, const torch::Tensor& quants, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& mins, int64_t kind) {
  const Matrix w = matrix_of(quants, scales, mins, kind);
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) == w.in, "x: float32 [rows, in]");
  const torch::Tensor xc = x.contiguous();
  const int64_t rows = xc.size(0), out_features = quants.size(0);
  torch::Tensor y = torch::empty({rows, out_features}, xc.options());
  multiply(w, xc.data_ptr<float>(), rows, y.data_ptr<float>(), out_features);
  return y;
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &block_linear, "y = x @ W.T for a weight in GGML blocks");
  m.def("dequantize", &dequantize, "rows of a weight in GGML blocks as float32");
  m.def("uses_avx2", &use_avx2, "whether the AVX2+FMA+F16C path runs on this CPU");
  m.def("set_scalar_only", &set_scalar_only, "run the portable path even where AVX2 is there (tests)");
}
