// y = x @ W.T for a weight kept in GGML's K-quant super-blocks (Q4_K, Q5_K, Q6_K), repacked by k_quants.py into
// k_blocks.h's layout with the file's values. Every product runs in integers as llama.cpp multiplies K-quants:
// the activation rows are quantized once per product to int8 per 32 values, each 4-value slice of 8 weight rows
// meets 4 broadcast activations in one u8 x s8 dot product, and each 32-value block adds its float scales once.
// A decode step (1 to 8 rows) asked at 16 bits (block_linear.py's default) quantizes each row to 16 bits per 32
// values and runs it as two int8 rows, its high and low bytes, whose block sums join as 256 high + low in int32
// before one convert and scale: twice the dot products, on weights read once. A decode step threads over the
// groups of output rows; more rows (prefill) run as a GEMM of the
// same tiles, the activations taken in chunks that stay in L2 while a thread's groups stream past them. The
// path is chosen at run time from the CPU (AVX-512 with VNNI, AVX-512 BW, AVX2, else portable scalar code) or
// forced by `TIDEGATE_CPU_ISA` / `set_k_isa` (tests run each one).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "k_blocks.h"
#include "model_ops.h"
#include "vector_math.h"

namespace tidegate_k {

namespace {

constexpr float kSmallestBlock = 1e-30f;  // below it levels / amax overflows: such a block rounds to zeros
constexpr int64_t kChunkRows = 64;
constexpr int64_t kFewRows = 8;  // activation rows of a decode step: split into two int8 rows each at 16 bits
constexpr float kSplitLevels = 127.0f * 257.0f;  // the largest 16-bit value whose high byte (rounded down) is 127  // activation rows a GEMM pass keeps in L2 while the weights stream past

// The 6-bit (Q6_K: 6-bit with the high bits) quant of value k (0..31) of row r of a block's group data `blk`.
int quant_of(KKind kind, const uint8_t* blk, int64_t r, int64_t k) {
  const int64_t t = (k % 16) / 4, j = k % 4, half = k / 16, byte = 4 * r + j;
  int q = (blk[32 * t + byte] >> (4 * half)) & 15;
  if (kind == Q5_K) q |= ((blk[128 + byte] >> (4 * half + t)) & 1) << 4;
  if (kind == Q6_K) q |= ((blk[128 + 32 * half + byte] >> (2 * t)) & 3) << 4;
  return q;
}

float half_at(const uint8_t* p) {
  c10::Half h;
  std::memcpy(&h, p, sizeof h);
  return static_cast<float>(h);
}

}  // namespace

void dequantize_k_block(const KMatrix& w, int64_t o, int64_t b, float* out) {
  const int64_t r = o % kRowsPerGroup;
  const uint8_t* sup = w.super(o / kRowsPerGroup, b / 8);
  const uint8_t* blk = sup + header_bytes(w.kind) + (b % 8) * block_bytes(w.kind);
  const uint8_t* scales = blk + 128 + bits_bytes(w.kind);
  const float d = half_at(sup + 2 * r);
  if (w.kind == Q6_K) {
    for (int64_t k = 0; k < kSub; ++k) {
      const float sc = static_cast<float>(static_cast<int8_t>(scales[8 * (k / 16) + r]));
      out[k] = d * sc * static_cast<float>(quant_of(w.kind, blk, r, k) - 32);  // exact: 23 bits at most
    }
    return;
  }
  // As the file's reference computes it: (d * scale) * q - dmin * minimum, each product exact, one rounding.
  const float scale = d * static_cast<float>(scales[r]), min = half_at(sup + 16 + 2 * r) * static_cast<float>(scales[8 + r]);
  for (int64_t k = 0; k < kSub; ++k) out[k] = scale * static_cast<float>(quant_of(w.kind, blk, r, k)) - min;
}

void quantize_k_rows(const float* x, int64_t rows, int64_t in, int8_t* q, float* dx, int32_t* sums) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kSub; ++b) {
      const float* v = x + r * in + b * kSub;
      float amax = 0.0f;
      for (int j = 0; j < kSub; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float id = amax >= kSmallestBlock ? 127.0f / amax : 0.0f;
      int8_t* qb = q + r * in + b * kSub;
      int32_t sum[2] = {0, 0};
      for (int j = 0; j < kSub; ++j) {
        qb[j] = static_cast<int8_t>(std::nearbyint(v[j] * id));  // the default rounding: to nearest even
        sum[j / 16] += qb[j];
      }
      dx[r * (in / kSub) + b] = amax / 127.0f;
      sums[r * (in / 16) + 2 * b] = sum[0];
      sums[r * (in / 16) + 2 * b + 1] = sum[1];
    }
}

void split_k_rows(const float* x, int64_t rows, int64_t in, int8_t* q, float* dx, int32_t* sums) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kSub; ++b) {
      const float* v = x + r * in + b * kSub;
      float amax = 0.0f;
      for (int j = 0; j < kSub; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float id = amax >= kSmallestBlock ? kSplitLevels / amax : 0.0f;
      int8_t* high = q + 2 * r * in + b * kSub;
      int8_t* low = high + in;
      int32_t sum[2][2] = {{0, 0}, {0, 0}};
      for (int j = 0; j < kSub; ++j) {
        const int v16 = static_cast<int>(std::nearbyint(v[j] * id));  // |v16| <= 32639
        const int h = (v16 + 128) >> 8;  // arithmetic shift: floor, so that low = v16 - 256 h is in -128..127
        high[j] = static_cast<int8_t>(h);
        low[j] = static_cast<int8_t>(v16 - 256 * h);
        sum[0][j / 16] += high[j];
        sum[1][j / 16] += low[j];
      }
      const float step = amax / kSplitLevels;
      for (int half = 0; half < 2; ++half) {
        const int64_t row = 2 * r + half;
        dx[row * (in / kSub) + b] = half == 0 ? 256.0f * step : step;
        sums[row * (in / 16) + 2 * b] = sum[half][0];
        sums[row * (in / 16) + 2 * b + 1] = sum[half][1];
      }
    }
}

#if defined(__x86_64__)
namespace {

using tidegate_simd::hsum_epi32;

// 32 int32 values (each within int8) stored as bytes in order: the packs interleave 128-bit lanes, the permute
// puts the 4-byte pieces back.
AVX2_TARGET inline void store_bytes(const __m256i q[4], int8_t* out) {
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// A quantized block's bytes, scale and sums per 16 values (row `row` of KRows' arrays, block b).
AVX2_TARGET inline void put_block(const __m256i q[4], float scale, int64_t row, int64_t b, int64_t in, int8_t* qs,
                                  float* dx, int32_t* sums) {
  store_bytes(q, qs + row * in + b * kSub);
  dx[row * (in / kSub) + b] = scale;
  sums[row * (in / 16) + 2 * b] = hsum_epi32(_mm256_add_epi32(q[0], q[1]));
  sums[row * (in / 16) + 2 * b + 1] = hsum_epi32(_mm256_add_epi32(q[2], q[3]));
}

// quantize_k_rows and split_k_rows in AVX2: the same integers and scales (4x faster on an 8192-value row).
AVX2_TARGET void quantize_k_rows_avx2(const float* x, int64_t rows, int64_t in, int8_t* q, float* dx,
                                      int32_t* sums) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kSub; ++b) {
      __m256 f[4];
      const float amax = tidegate_simd::load_block_amax(x + r * in + b * kSub, f);
      __m256i v[4];
      tidegate_simd::round_block(f, amax >= kSmallestBlock ? 127.0f / amax : 0.0f, v);
      put_block(v, amax / 127.0f, r, b, in, q, dx, sums);
    }
}

AVX2_TARGET void split_k_rows_avx2(const float* x, int64_t rows, int64_t in, int8_t* q, float* dx, int32_t* sums) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kSub; ++b) {
      __m256 f[4];
      const float amax = tidegate_simd::load_block_amax(x + r * in + b * kSub, f);
      __m256i v[4], high[4], low[4];
      tidegate_simd::round_block(f, amax >= kSmallestBlock ? kSplitLevels / amax : 0.0f, v);
      for (int i = 0; i < 4; ++i) {
        high[i] = _mm256_srai_epi32(_mm256_add_epi32(v[i], _mm256_set1_epi32(128)), 8);  // floor, as the scalar
        low[i] = _mm256_sub_epi32(v[i], _mm256_slli_epi32(high[i], 8));
      }
      const float step = amax / kSplitLevels;
      put_block(high, 256.0f * step, 2 * r, b, in, q, dx, sums);
      put_block(low, step, 2 * r + 1, b, in, q, dx, sums);
    }
}
}  // namespace
#endif

namespace {

// Block b's integer product with row i, the 16-value halves apart: sum(q * x) (Q6_K: sum((q - 32) * x)).
void block_dots(const KMatrix& w, int64_t o, int64_t b, const int8_t* xq, const int32_t* sums, int64_t dot[2]) {
  const int64_t r = o % kRowsPerGroup;
  const uint8_t* blk = w.super(o / kRowsPerGroup, b / 8) + header_bytes(w.kind) + (b % 8) * block_bytes(w.kind);
  dot[0] = dot[1] = 0;
  for (int64_t k = 0; k < kSub; ++k) dot[k / 16] += quant_of(w.kind, blk, r, k) * xq[k];
  if (w.kind == Q6_K)
    for (int half = 0; half < 2; ++half) dot[half] -= 32 * sums[half];
}

}  // namespace

void k_rows_scalar(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin,
                   int64_t end) {
  const int64_t blocks = w.in / kSub, stride = split ? 2 : 1;
  for (int64_t o = begin * kRowsPerGroup; o < std::min(end * kRowsPerGroup, w.out); ++o) {
    const int64_t r = o % kRowsPerGroup;
    for (int64_t i = 0; i < rows; i += stride) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* sup = w.super(o / kRowsPerGroup, b / 8);
        const uint8_t* scales = sup + header_bytes(w.kind) + (b % 8) * block_bytes(w.kind) + 128 + bits_bytes(w.kind);
        // A split row's dot products and sums join its high and low bytes' in integers (exact), as the vector
        // paths do; its step is its low bytes'.
        int64_t dot[2], sum[2];
        block_dots(w, o, b, x.q + i * w.in + b * kSub, x.sums + i * (w.in / 16) + 2 * b, dot);
        for (int half = 0; half < 2; ++half) sum[half] = x.sums[i * (w.in / 16) + 2 * b + half];
        if (split) {
          const int64_t low = i + 1;
          int64_t low_dot[2];
          block_dots(w, o, b, x.q + low * w.in + b * kSub, x.sums + low * (w.in / 16) + 2 * b, low_dot);
          for (int half = 0; half < 2; ++half) {
            dot[half] = 256 * dot[half] + low_dot[half];
            sum[half] = 256 * sum[half] + x.sums[low * (w.in / 16) + 2 * b + half];
          }
        }
        const float d = half_at(sup + 2 * r), dx = x.dx[(i + stride - 1) * blocks + b];
        if (w.kind == Q6_K) {
          const int64_t lo = static_cast<int8_t>(scales[r]), hi = static_cast<int8_t>(scales[8 + r]);
          acc += static_cast<float>(lo * dot[0] + hi * dot[1]) * (d * dx);
        } else {
          acc += static_cast<float>(dot[0] + dot[1]) * (d * static_cast<float>(scales[r]) * dx);
          acc -= half_at(sup + 16 + 2 * r) * static_cast<float>(scales[8 + r]) * (dx * static_cast<float>(sum[0] + sum[1]));
        }
      }
      y[i / stride * w.out + o] = acc;
    }
  }
}

#if defined(__x86_64__)
namespace {
#define K_TARGET __attribute__((target("avx2,fma,f16c")))

#include "k_blocks_avx2.h"
#include "k_blocks_kernel.h"
#undef K_TARGET
}  // namespace

void k_rows_avx2(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin, int64_t end) {
  k_rows<Avx2>(w, x, rows, split, y, begin, end);
}
#else
void k_rows_avx2(const KMatrix&, const KRows&, int64_t, bool, float*, int64_t, int64_t) { TORCH_CHECK(false, "no AVX2"); }
#endif

namespace {

enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

int best_isa() {
  if (cpu_has_avx512()) return kAvx512;
  return tidegate_simd::cpu_has_avx2() ? kAvx2 : kScalar;
}

int isa_named(const std::string& name) {
  if (name == "scalar") return kScalar;
  if (name == "avx2") return kAvx2;
  if (name == "avx512") return kAvx512;
  TORCH_CHECK(false, "unknown instruction set ", name, " (scalar, avx2 or avx512)");
  return kScalar;
}

// The path products take: the best this CPU runs, capped by the one limit every kernel of the extension shares
// (vector_math.h: TIDEGATE_CPU_ISA at load, set_isa or set_k_isa from tests).
int isa_now() {
  const int limit = tidegate_simd::isa_limit().load();
  return std::min(limit >= tidegate_simd::kAvx512Vnni ? int{kAvx512} : limit, best_isa());
}

std::string set_k_isa(const std::string& name) {
  const int isa = isa_named(name);
  TORCH_CHECK(isa <= best_isa(), "this CPU cannot run the ", name, " path");
  tidegate_simd::set_isa_limit(isa == kAvx512 ? int{tidegate_simd::kAvx512Vnni} : isa);
  return name;
}

std::string k_isa() {
  const int isa = isa_now();
  if (isa == kAvx512) return cpu_has_vnni() ? "avx512-vnni" : "avx512";
  return isa == kAvx2 ? "avx2" : "scalar";
}

KMatrix k_matrix(const torch::Tensor& data, int64_t kind, int64_t out_features) {
  TORCH_CHECK(is_k_kind(kind), "not a K-quant kind: ", kind);
  TORCH_CHECK(data.dtype() == torch::kUInt8 && data.is_contiguous() && data.dim() == 2, "data: uint8 [groups, bytes]");
  const KKind k = static_cast<KKind>(kind);
  TORCH_CHECK(data.size(1) % super_bytes(k) == 0, "data rows are not whole super-blocks");
  KMatrix w{data.data_ptr<uint8_t>(), data.size(1) / super_bytes(k) * kSuper, out_features, k};
  TORCH_CHECK(out_features >= 0 && data.size(0) == w.groups(), "data holds ", data.size(0), " groups, not ",
              w.groups());
  return w;
}

void run_groups(int isa, const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin,
                int64_t end) {
  if (isa == kAvx512) return k_rows_avx512(w, x, rows, split, y, begin, end);
  if (isa == kAvx2) return k_rows_avx2(w, x, rows, split, y, begin, end);
  k_rows_scalar(w, x, rows, split, y, begin, end);
}

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& data, int64_t kind, int64_t activation_bits,
                     int64_t out_features) {
  const KMatrix w = k_matrix(data, kind, out_features);
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) == w.in, "x: float32 [rows, ", w.in, "]");
  TORCH_CHECK(activation_bits == 8 || activation_bits == 16 || activation_bits == 32, "activation bits: 8, 16 or 32");
  const torch::Tensor xc = x.contiguous();
  const int64_t rows = xc.size(0), in = w.in;
  torch::Tensor y = torch::empty({rows, out_features}, xc.options());
  if (rows == 0) return y;
  // Decode rows asked at 16 bits or more run as two int8 rows each (split_k_rows); other rows at 8 bits.
  const bool split = activation_bits > 8 && rows <= kFewRows;
  const int64_t n = split ? 2 * rows : rows;
  thread_local std::vector<int8_t> q;  // a decode step makes a hundred products: the scratch is kept
  thread_local std::vector<float> dx;
  thread_local std::vector<int32_t> sums;
  q.resize(n * in);
  dx.resize(n * in / kSub);
  sums.resize(n * in / 16);
  const int isa = isa_now();
  auto quantize = split ? split_k_rows : quantize_k_rows;  // the same integers on every path
#if defined(__x86_64__)
  if (isa >= kAvx2) quantize = split ? split_k_rows_avx2 : quantize_k_rows_avx2;
#endif
  quantize(xc.data_ptr<float>(), rows, in, q.data(), dx.data(), sums.data());
  const KRows xq{q.data(), dx.data(), sums.data()};
  const int64_t unit = isa == kAvx512 && n > kWideRows ? 2 : 1;  // the wide AVX-512 path takes two groups at a time
  const int64_t units = (w.groups() + unit - 1) / unit;
  // A task of a few hundred microseconds at least; small matrices stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 32768 / (unit * kRowsPerGroup * in / 16 * std::min<int64_t>(n, kChunkRows)));
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    const int64_t g0 = begin * unit, g1 = std::min(end * unit, w.groups());
    for (int64_t r0 = 0; r0 < n; r0 += kChunkRows) {  // kChunkRows is even: a chunk never parts a split pair
      const KRows part{xq.q + r0 * in, xq.dx + r0 * (in / kSub), xq.sums + r0 * (in / 16)};
      run_groups(isa, w, part, std::min(kChunkRows, n - r0), split, yp + r0 / (split ? 2 : 1) * out_features, g0, g1);
    }
  });
  return y;
}

torch::Tensor dequantize_rows(const torch::Tensor& data, int64_t kind, int64_t out_features, const torch::Tensor& ids) {
  const KMatrix w = k_matrix(data, kind, out_features);
  const torch::Tensor rows = ids.to(torch::kInt64).contiguous();
  TORCH_CHECK(rows.dim() == 1, "ids: one dimension");
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t n = rows.numel();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(row[i] >= 0 && row[i] < out_features, "row ", row[i], " out of bounds");
  torch::Tensor out = torch::empty({n, w.in}, torch::TensorOptions().dtype(torch::kFloat32));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, std::max<int64_t>(1, 16384 / std::max<int64_t>(w.in, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t b = 0; b < w.in / kSub; ++b) dequantize_k_block(w, row[i], b, op + i * w.in + b * kSub);
  });
  return out;
}

// A zeroed uint8 tensor on memory the system is asked to back with 2 MB pages, for a weight's bytes to be written
// into (no copy at load). A decode step streams every weight once: on 4 KB pages each page starts the hardware
// prefetcher cold and costs a TLB walk, and the products of a Llama-3.2-1B step took ~15% more CPU time. The
// mapping is cut to the tensor's size, so only its whole 2 MB extents take huge pages and no tail is wasted;
// below 2 MB, or where the system declines (THP "never"), torch's own zeros.
torch::Tensor huge_page_zeros(const std::vector<int64_t>& sizes) {
  const auto options = torch::TensorOptions().dtype(torch::kUInt8);
  constexpr size_t kHuge = size_t{2} << 20, kPage = 4096;
  size_t bytes = 1;
  for (const int64_t n : sizes) bytes *= static_cast<size_t>(n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHuge) return torch::zeros(sizes, options);
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return torch::zeros(sizes, options);
  auto* const base = static_cast<uint8_t*>(raw);
  auto* const start = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~(kHuge - 1));
  if (start > base) munmap(base, start - base);
  if (base + size + kHuge > start + size) munmap(start + size, base + size + kHuge - (start + size));
  if (madvise(start, size, MADV_HUGEPAGE) != 0) {
    munmap(start, size);
    return torch::zeros(sizes, options);
  }
  // An anonymous mapping reads as zeros: the pages become resident as the caller writes them.
  return torch::from_blob(start, sizes, [size](void* p) { munmap(p, size); }, options);
#else
  (void)kHuge, (void)kPage;
  return torch::zeros(sizes, options);
#endif
}

}  // namespace tidegate_k

torch::Tensor tidegate_ops::k_linear(const torch::Tensor& x, const torch::Tensor& data, int64_t kind,
                                     int64_t activation_bits, int64_t out_features) {
  return tidegate_k::linear(x, data, kind, activation_bits, out_features);
}

torch::Tensor tidegate_ops::k_dequantize(const torch::Tensor& data, int64_t kind, int64_t out_features,
                                         const torch::Tensor& ids) {
  return tidegate_k::dequantize_rows(data, kind, out_features, ids);
}

void tidegate_ops::bind_k_blocks(pybind11::module& m) {
  const auto no_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("k_linear", &tidegate_ops::k_linear, "y = x @ W.T for a weight in repacked K-quant super-blocks (1-8 rows at 16 bits if asked, as two int8 rows)", no_gil);
  m.def("k_dequantize", &tidegate_ops::k_dequantize, "rows `ids` of a repacked K-quant weight as float32", no_gil);
  m.def("huge_page_zeros", &tidegate_k::huge_page_zeros,
        "a zeroed tensor on 2 MB pages where the system grants them (else torch.zeros)");
  m.def("k_isa", &tidegate_k::k_isa, "the instruction set the K-quant products run on now");
  m.def("set_k_isa", &tidegate_k::set_k_isa, "force the K-quant products' path: scalar, avx2 or avx512 (tests)");
}
