// GGML's 32-value blocks as block_matmul.cpp, block_gemm.cpp and block_integer_dot.cpp read them: the
// repacked matrix, the exact dequantization of one block, and activations quantized for integer products.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>

#include "vector_math.h"

namespace tidegate_blocks {

using namespace tidegate_simd;

enum Kind : int64_t { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };
constexpr int64_t kBlock = 32;
constexpr int64_t kFewRows = 8;  // activation rows that share each unpacked weight block: one decode tile
constexpr int64_t kPanel = 16;  // output rows of a dequantized GEMM panel: two 8-float vectors at each k

struct Matrix {
  const uint8_t* quants;
  const c10::Half* scales;
  const c10::Half* mins;  // Q4_1 only
  int64_t in;
  Kind kind;

  int64_t blocks() const { return in / kBlock; }
  int64_t row_bytes() const { return kind == Q8_0 ? in : in / 2; }
};

// Activation rows quantized per 32-value block into T (int8_t or int16_t): q [rows, in], and per block
// [rows, in / 32] the scale d and d * sum(q) (Q4_1's minimum term).
template <typename T>
struct QuantizedRows {
  T* q;
  float* d;
  float* s;
};

// Up to kFewRows rows quantized, then multiplied with output rows [begin, end) in integer dot products
// (block_integer_dot.cpp; instantiated for int8_t and int16_t).
template <typename T>
void quantize_rows_scalar(const float* x, int64_t rows, int64_t in, const QuantizedRows<T>& out);
template <typename T>
void integer_rows_scalar(const Matrix& w, const QuantizedRows<T>& x, int64_t rows, float* y, int64_t out_features,
                         int64_t begin, int64_t end);

// The 32 float32 values of block b of output row o.
inline void dequantize_block_scalar(const Matrix& w, int64_t o, int64_t b, float* out) {
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

#if defined(__x86_64__)
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

// Many rows (prefill, big batches) as a GEMM over the panels [begin, end) of kPanel output rows (block_gemm.cpp).
AVX2_TARGET void many_rows_avx2(const Matrix& w, const float* x, int64_t rows, float* y, int64_t out_features,
                                int64_t begin, int64_t end);
template <typename T>
AVX2_TARGET void quantize_rows_avx2(const float* x, int64_t rows, int64_t in, const QuantizedRows<T>& out);
template <typename T>
AVX2_TARGET void integer_rows_avx2(const Matrix& w, const QuantizedRows<T>& x, int64_t rows, float* y,
                                   int64_t out_features, int64_t begin, int64_t end);
#endif

}  // namespace tidegate_blocks
