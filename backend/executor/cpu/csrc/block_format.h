// GGML's 32-value blocks as block_matmul.cpp, block_gemm.cpp and block_integer_dot.cpp read them: the
// interleaved matrix, the exact dequantization of its blocks, and activations quantized for integer products.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>

#include "vector_math.h"

namespace tidegate_blocks {

using namespace tidegate_simd;

enum Kind : int64_t { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q5_0 = 6 };  // 3..5: k_blocks.h's K-quants
constexpr bool is_block_kind(int64_t kind) { return (kind >= Q4_0 && kind <= Q8_0) || kind == Q5_0; }
constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 8;  // output rows interleaved together: one int32 lane each in a 256-bit vector
constexpr int64_t kFewRows = 8;  // activation rows of the integer decode path; more run as a GEMM
constexpr int64_t kPanel = 16;  // output rows of a dequantized GEMM panel: two groups, two 8-float vectors at each k

// A matrix of `out` rows in the interleaved layout block_linear.py packs: the rows in groups of kGroup (the last
// padded with zero rows), and within a group each block's quant bytes in 2-byte units, unit u of the group's row
// i at byte 16 u + 2 i. Widened to int16, a 16-byte unit vector holds two values of each of the 8 rows side by
// side, which is what one madd needs to form a 2-value dot product per row: a group's block meets an activation
// pair broadcast, with its 8 sums in the lanes of one vector (no horizontal sums), and one float16 load gives the
// group's 8 scales of the block (scales and mins are [groups][blocks][8]).
struct Matrix {
  const uint8_t* quants;
  const c10::Half* scales;
  const c10::Half* mins;  // Q4_1 only
  int64_t in, out;
  Kind kind;

  int64_t blocks() const { return in / kBlock; }
  int64_t groups() const { return (out + kGroup - 1) / kGroup; }
  // Of one row. Q5_0's are Q4_0's 16 nibble bytes, then its 32-bit mask of fifth bits (units 8 and 9: the bits of
  // values 0..15, then of 16..31).
  int64_t block_bytes() const { return kind == Q8_0 ? kBlock : (kind == Q5_0 ? kBlock / 2 + 4 : kBlock / 2); }
  const uint8_t* group_block(int64_t g, int64_t b) const { return quants + (g * blocks() + b) * kGroup * block_bytes(); }
  // Byte j of block b of row o, and the block's scale and minimum.
  uint8_t byte(int64_t o, int64_t b, int64_t j) const {
    return group_block(o / kGroup, b)[(j / 2) * 2 * kGroup + (o % kGroup) * 2 + j % 2];
  }
  int64_t scale_index(int64_t o, int64_t b) const { return (o / kGroup * blocks() + b) * kGroup + o % kGroup; }
};

// Activation rows quantized per 32-value block to integers of at most `levels` in magnitude (127: llama.cpp's
// 8-bit activations, 32767: 16-bit ones), kept as int16 either way: q [rows, in], and per block [rows, in / 32]
// the scale d and d * sum(q) (Q4_1's minimum term).
struct QuantizedRows {
  int16_t* q;
  float* d;
  float* s;
};

// Up to kFewRows rows quantized, then multiplied with the output groups [begin, end) in integer dot products
// (block_integer_dot.cpp).
void quantize_rows_scalar(const float* x, int64_t rows, int64_t in, float levels, const QuantizedRows& out);
void integer_rows_scalar(const Matrix& w, const QuantizedRows& x, int64_t rows, float* y, int64_t begin, int64_t end);

// Q5_0's mask of block b of output row o: bit j is value j's fifth bit.
inline uint32_t fifth_bits(const Matrix& w, int64_t o, int64_t b) {
  uint32_t mask = 0;
  for (int j = 0; j < 4; ++j) mask |= static_cast<uint32_t>(w.byte(o, b, kBlock / 2 + j)) << (8 * j);
  return mask;
}

// The 32 float32 values of block b of output row o.
inline void dequantize_block_scalar(const Matrix& w, int64_t o, int64_t b, float* out) {
  const float d = static_cast<float>(w.scales[w.scale_index(o, b)]);
  if (w.kind == Q8_0) {
    for (int j = 0; j < kBlock; ++j) out[j] = static_cast<float>(static_cast<int8_t>(w.byte(o, b, j))) * d;
    return;
  }
  const float m = w.kind == Q4_1 ? static_cast<float>(w.mins[w.scale_index(o, b)]) : 0.0f;
  const int offset = w.kind == Q4_0 ? 8 : (w.kind == Q5_0 ? 16 : 0);
  const uint32_t fifth = w.kind == Q5_0 ? fifth_bits(w, o, b) : 0;
  for (int j = 0; j < kBlock / 2; ++j) {
    const int q = w.byte(o, b, j);
    const int low = (q & 15) + static_cast<int>((fifth >> j) & 1) * 16 - offset;
    const int high = (q >> 4) + static_cast<int>((fifth >> (j + 16)) & 1) * 16 - offset;
    out[j] = static_cast<float>(low) * d + m;
    out[j + 16] = static_cast<float>(high) * d + m;
  }
}

#if defined(__x86_64__)
AVX2_TARGET inline float half_to_float(c10::Half h) { return _cvtsh_ss(h.x); }

// 16 bytes of Q4 quants as their values in signed bytes: the low nibbles and the high ones (minus 8 for Q4_0).
struct Nibbles {
  __m128i low, high;
};

AVX2_TARGET inline Nibbles split_nibbles(__m128i raw, Kind kind) {
  const __m128i low4 = _mm_set1_epi8(15), offset = _mm_set1_epi8(kind == Q4_0 ? 8 : 0);
  return {_mm_sub_epi8(_mm_and_si128(raw, low4), offset),
          _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), offset)};
}

// Q5_0's fifth bits for unit u of a group's block (q: the block), as 16 or 0 in the byte of each quant byte of
// the unit (byte 2 i + e: row i's value 2 u + e in `low`, value 2 u + e + 16 in `high`). Word i of unit 8 (9)
// holds row i's bits of values 0..15 (16..31), so bits 2 u and 2 u + 1 of a word go to its two bytes' bit 4.
AVX2_TARGET inline Nibbles fifth_of_unit(const uint8_t* q, int64_t u) {
  const __m128i one = _mm_set1_epi16(0x0010), other = _mm_set1_epi16(0x1000);
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(2 * u));
  Nibbles out;
  for (int half = 0; half < 2; ++half) {
    const __m128i t = _mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * (8 + half))), shift);
    const __m128i bits = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(t, 4), one), _mm_and_si128(_mm_slli_epi16(t, 11), other));
    (half == 0 ? out.low : out.high) = bits;
  }
  return out;
}

// Unit u of a group's block (q) as the values of its quant bytes in signed bytes: Q4 nibbles (split_nibbles), or
// Q5_0's with their fifth bits, minus 16.
AVX2_TARGET inline Nibbles unit_values(const uint8_t* q, int64_t u, Kind kind) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * u));
  if (kind != Q5_0) return split_nibbles(raw, kind);
  const Nibbles n = split_nibbles(raw, Q4_1), f = fifth_of_unit(q, u);
  const __m128i sixteen = _mm_set1_epi8(16);
  return {_mm_sub_epi8(_mm_or_si128(n.low, f.low), sixteen), _mm_sub_epi8(_mm_or_si128(n.high, f.high), sixteen)};
}

// The 8 rows at positions k and k + 1, as signed bytes (the first 8 and the last 8), dequantized and stored at
// out + k * stride and out + (k + 1) * stride.
AVX2_TARGET inline void store_positions(__m128i rows2, __m256 d, __m256 m, bool with_min, float* out, int64_t k,
                                        int64_t stride) {
  for (int e = 0; e < 2; ++e) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e == 0 ? rows2 : _mm_srli_si128(rows2, 8)));
    // q * d is exact in float32: one rounding, as the scalar q * d + m
    _mm256_storeu_ps(out + (k + e) * stride, with_min ? _mm256_fmadd_ps(v, d, m) : _mm256_mul_ps(v, d));
  }
}

// Block b of the kGroup rows of group g, dequantized exactly: the 8 rows' values at position k (a vector, row i
// in lane i) stored at out + k * stride.
AVX2_TARGET inline void dequantize_group_avx2(const Matrix& w, int64_t g, int64_t b, float* out, int64_t stride) {
  const uint8_t* q = w.group_block(g, b);
  const int64_t at = (g * w.blocks() + b) * kGroup;
  const bool with_min = w.kind == Q4_1;
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + at)));
  const __m256 m = with_min ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins + at)))
                            : _mm256_setzero_ps();
  // Bytes 2 i + e of a unit are row i's: the even bytes first, then the odd ones, so that each 8 bytes are the
  // 8 rows at one position.
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t u = 0; u < (w.kind == Q8_0 ? kBlock : kBlock / 2) / 2; ++u) {
    if (w.kind == Q8_0) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * u));
      store_positions(_mm_shuffle_epi8(raw, split), d, m, false, out, 2 * u, stride);
      continue;
    }
    const Nibbles values = unit_values(q, u, w.kind);
    store_positions(_mm_shuffle_epi8(values.low, split), d, m, with_min, out, 2 * u, stride);
    store_positions(_mm_shuffle_epi8(values.high, split), d, m, with_min, out, 2 * u + 16, stride);
  }
}

// Many rows (prefill, big batches) as a GEMM over the panels [begin, end) of kPanel output rows (block_gemm.cpp).
AVX2_TARGET void many_rows_avx2(const Matrix& w, const float* x, int64_t rows, float* y, int64_t begin, int64_t end);
// Many rows (prefill, big batches) of a weight with 8- or 16-bit activations, on AVX-512 VNNI: the rows quantized
// as the decode path quantizes them (x, with x8 their int8 copy for 8-bit activations, else null), multiplied
// with the wide panels [begin, end) of kWidePanel output rows in integer dot products (block_gemm.cpp).
constexpr int64_t kWidePanel = 32;
AVX512_TARGET void many_rows_vnni(const Matrix& w, const QuantizedRows& x, const int8_t* x8, int64_t rows, float* y,
                                  int64_t begin, int64_t end);
// n int16 values (each within -127..127) as int8.
AVX512_TARGET void narrow_to_int8(const int16_t* q, int64_t n, int8_t* out);
AVX2_TARGET void quantize_rows_avx2(const float* x, int64_t rows, int64_t in, float levels, const QuantizedRows& out);
AVX2_TARGET void integer_rows_avx2(const Matrix& w, const QuantizedRows& x, int64_t rows, float* y, int64_t begin,
                                   int64_t end);
#endif

}  // namespace tidegate_blocks
