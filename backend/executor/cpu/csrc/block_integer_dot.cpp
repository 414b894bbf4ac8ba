// The few-rows path of block_matmul.cpp in integer arithmetic, as llama.cpp multiplies a decode step: each
// activation row is quantized once per product into 32-value blocks (a float scale dx = max|x| / L, the values
// round(x / dx) to nearest even, and dx * their sum for Q4_1's minimum term), and every weight block meets it
// in an integer dot product. L is 127 for 8-bit activations (llama.cpp's quantize_row_q8_1) or 32767 for
// 16-bit ones; both are kept as int16, so one path multiplies either. The AVX2 path reads the interleaved
// layout (block_format.h): a 16-byte unit of a group's block, widened to int16, holds two values of each of its
// 8 rows (Q4: two more in the high nibbles), and one madd with a broadcast activation pair adds a 2-value dot
// product to each row's int32 lane. A block's lanes are converted once and added with one FMA by d * dx for
// all 8 rows, and Q4_1 adds m * dx * sum(x): per block and row about 2 madds and 4 other instructions, with
// no horizontal sums. The weights stay the file's values; only the activations are rounded. The scalar path
// computes the same integers.
#include "block_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tidegate_blocks {

namespace {

// Blocks whose largest |x| is below this round to zeros: levels / amax would overflow to infinity near 1e-34.
constexpr float kSmallestBlock = 1e-30f;
// How many blocks ahead a group's weights are prefetched: the hardware prefetcher alone left one core at ~10
// GB/s and a one-row product of the 49,152-row head at 1.3 ms on two; asking 32 blocks ahead (4 KB of Q4)
// brought it to 0.7 ms (docs/benchmarks.md).
constexpr int64_t kPrefetchBlocks = 32;

// Weight block b of output row o against the block's quantized activations: their integer dot product.
int32_t dot_scalar(const Matrix& w, int64_t o, int64_t b, const int16_t* xq) {
  int32_t dot = 0;
  if (w.kind == Q8_0) {
    for (int j = 0; j < kBlock; ++j) dot += static_cast<int8_t>(w.byte(o, b, j)) * xq[j];
    return dot;
  }
  const int offset = w.kind == Q4_0 ? 8 : (w.kind == Q5_0 ? 16 : 0);
  const uint32_t fifth = w.kind == Q5_0 ? fifth_bits(w, o, b) : 0;
  for (int j = 0; j < kBlock / 2; ++j) {
    const uint8_t q = w.byte(o, b, j);
    const int low = (q & 15) + static_cast<int>((fifth >> j) & 1) * 16;
    const int high = (q >> 4) + static_cast<int>((fifth >> (j + 16)) & 1) * 16;
    dot += (low - offset) * xq[j] + (high - offset) * xq[j + 16];
  }
  return dot;
}

}  // namespace

void quantize_rows_scalar(const float* x, int64_t rows, int64_t in, float levels, const QuantizedRows& out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kBlock; ++b) {
      const float* v = x + r * in + b * kBlock;
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float id = amax >= kSmallestBlock ? levels / amax : 0.0f;  // an all-zero block: values 0
      int16_t* q = out.q + r * in + b * kBlock;
      int sum = 0;
      for (int j = 0; j < kBlock; ++j) {
        q[j] = static_cast<int16_t>(std::nearbyint(v[j] * id));  // the default rounding mode: to nearest even
        sum += q[j];
      }
      const int64_t i = r * (in / kBlock) + b;
      out.d[i] = amax / levels;
      out.s[i] = out.d[i] * static_cast<float>(sum);
    }
}

void integer_rows_scalar(const Matrix& w, const QuantizedRows& x, int64_t rows, float* y, int64_t begin, int64_t end) {
  const int64_t nb = w.blocks();
  for (int64_t o = begin * kGroup; o < std::min(end * kGroup, w.out); ++o)
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i = r * nb + b;
        const float d = static_cast<float>(w.scales[w.scale_index(o, b)]);
        acc += d * x.d[i] * static_cast<float>(dot_scalar(w, o, b, x.q + r * w.in + b * kBlock));
        if (w.kind == Q4_1) acc += static_cast<float>(w.mins[w.scale_index(o, b)]) * x.s[i];
      }
      y[r * w.out + o] = acc;
    }
}

#if defined(__x86_64__)
namespace {

AVX2_TARGET inline __m128i load16(const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Widened weights (two values of each of 8 rows, side by side) times the activation pair at xq, broadcast: a
// 2-value dot product in each row's int32 lane.
AVX2_TARGET inline __m256i pair_dot(__m256i weights, const int16_t* xq) {
  int32_t pair;
  std::memcpy(&pair, xq, sizeof pair);
  return _mm256_madd_epi16(weights, _mm256_set1_epi32(pair));
}

// Group g's 8 output rows against R quantized rows (R <= 4: 2R accumulators and the unpacked weights fit the 16
// registers), the results stored at y (rows w.out apart).
template <Kind K, int R>
AVX2_TARGET void group_avx2(const Matrix& w, int64_t g, const QuantizedRows& x, float* y) {
  constexpr int64_t kBytes = kGroup * (K == Q8_0 ? kBlock : (K == Q5_0 ? kBlock / 2 + 4 : kBlock / 2));  // a group's block
  const int64_t nb = w.blocks(), in = w.in;
  const uint8_t* q = w.group_block(g, 0);
  const c10::Half* d8 = w.scales + g * nb * kGroup;
  const c10::Half* m8 = K == Q4_1 ? w.mins + g * nb * kGroup : nullptr;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, q += kBytes, d8 += kGroup, m8 += K == Q4_1 ? kGroup : 0) {
#pragma GCC unroll 4
    for (int64_t line = 0; line < kBytes; line += 64)  // past the matrix's end is harmless
      _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBlocks * kBytes + line), _MM_HINT_T0);
    const int16_t* xb = x.q + b * kBlock;
    __m256i dot[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
    if constexpr (K == Q8_0) {
      // Unrolled further, GCC hoists every madd of the block and spills them to the stack (3.6 against 2.8
      // cycles a block and row at 4 rows).
#pragma GCC unroll 2
      for (int u = 0; u < kBlock / 2; ++u) {
        const __m256i values = _mm256_cvtepi8_epi16(load16(q + 16 * u));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) dot[r] = _mm256_add_epi32(dot[r], pair_dot(values, xb + r * in + 2 * u));
      }
    } else {
      __m256i fifth_low = _mm256_setzero_si256(), fifth_high = fifth_low;
      if constexpr (K == Q5_0) {
        // Lanes 2 i and 2 i + 1 each hold row i's mask word (unit 8: values 0..15; unit 9: 16..31), the even lane's
        // shifted left once, so that unit u's bits for both lanes sit at bit 2 u + 1.
        const __m256i odd_even = _mm256_set1_epi32(0x00010002);
        const __m256i lo = _mm256_cvtepu16_epi32(load16(q + 16 * 8)), hi = _mm256_cvtepu16_epi32(load16(q + 16 * 9));
        fifth_low = _mm256_mullo_epi16(_mm256_or_si256(lo, _mm256_slli_epi32(lo, 16)), odd_even);
        fifth_high = _mm256_mullo_epi16(_mm256_or_si256(hi, _mm256_slli_epi32(hi, 16)), odd_even);
      }
#pragma GCC unroll 2
      for (int u = 0; u < kBlock / 4; ++u) {
        // Byte 2 i + e widened to a word: row i's value 2 u + e in its low nibble, value 2 u + e + 16 in its high.
        const __m256i words = _mm256_cvtepu8_epi16(load16(q + 16 * u));
        __m256i low = _mm256_and_si256(words, _mm256_set1_epi16(15)), high = _mm256_srli_epi16(words, 4);
        if (K == Q4_0) {
          low = _mm256_sub_epi16(low, _mm256_set1_epi16(8));
          high = _mm256_sub_epi16(high, _mm256_set1_epi16(8));
        }
        if constexpr (K == Q5_0) {  // q - 16 is the nibble, less 16 where the fifth bit is clear
          const __m256i bit = _mm256_set1_epi16(static_cast<int16_t>(1 << (2 * u + 1))), zero = _mm256_setzero_si256();
          const __m256i sixteen = _mm256_set1_epi16(16);
          low = _mm256_sub_epi16(low, _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(fifth_low, bit), zero), sixteen));
          high = _mm256_sub_epi16(high,
                                  _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(fifth_high, bit), zero), sixteen));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int16_t* xr = xb + r * in + 2 * u;
          dot[r] = _mm256_add_epi32(dot[r], _mm256_add_epi32(pair_dot(low, xr), pair_dot(high, xr + 16)));
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(load16(d8));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, _mm256_broadcast_ss(x.d + r * nb + b)),
                               acc[r]);
    if (K == Q4_1) {
      const __m256 m = _mm256_cvtph_ps(load16(m8));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(x.s + r * nb + b), acc[r]);
    }
  }
  const int64_t valid = std::min(kGroup, w.out - g * kGroup);  // the last group's padding rows are not stored
  alignas(32) float last[kGroup];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    float* out = y + r * w.out + g * kGroup;
    if (valid == kGroup) {
      _mm256_storeu_ps(out, acc[r]);
    } else {
      _mm256_store_ps(last, acc[r]);
      std::copy(last, last + valid, out);
    }
  }
}

constexpr int kTileRows = 4;
using GroupTile = void (*)(const Matrix&, int64_t, const QuantizedRows&, float*);

template <Kind K>
constexpr GroupTile kGroupTiles[kTileRows + 1] = {nullptr, group_avx2<K, 1>, group_avx2<K, 2>, group_avx2<K, 3>,
                                                  group_avx2<K, 4>};

AVX2_TARGET inline void store_packed(const __m256i q[4], int16_t* out) {
  for (int i = 0; i < 2; ++i)  // the pack interleaves 128-bit lanes; the permute puts them back in order
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * i),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * i], q[2 * i + 1]), 0xD8));
}

}  // namespace

AVX2_TARGET void quantize_rows_avx2(const float* x, int64_t rows, int64_t in, float levels, const QuantizedRows& out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kBlock; ++b) {
      __m256 f[4];
      const float amax = load_block_amax(x + r * in + b * kBlock, f);
      __m256i q[4];
      round_block(f, amax >= kSmallestBlock ? levels / amax : 0.0f, q);
      const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
      store_packed(q, out.q + r * in + b * kBlock);
      const int64_t i = r * (in / kBlock) + b;
      out.d[i] = amax / levels;
      out.s[i] = out.d[i] * static_cast<float>(sum);
    }
}

// Output groups [begin, end) against up to kFewRows quantized rows, in tiles of at most kTileRows rows of even
// size (5 rows: 3 and 2), each tile reading the group's weights again from L1.
AVX2_TARGET void integer_rows_avx2(const Matrix& w, const QuantizedRows& x, int64_t rows, float* y, int64_t begin,
                                   int64_t end) {
  const GroupTile* tiles = w.kind == Q8_0   ? kGroupTiles<Q8_0>
                           : w.kind == Q4_0 ? kGroupTiles<Q4_0>
                           : w.kind == Q5_0 ? kGroupTiles<Q5_0>
                                            : kGroupTiles<Q4_1>;
  const int64_t nb = w.blocks();
  for (int64_t g = begin; g < end; ++g)
    for (int64_t r0 = 0, tile = 0; r0 < rows; r0 += tile) {
      const int64_t left = rows - r0, passes = (left + kTileRows - 1) / kTileRows;
      tile = (left + passes - 1) / passes;
      const QuantizedRows part{x.q + r0 * w.in, x.d + r0 * nb, x.s + r0 * nb};
      tiles[tile](w, g, part, y + r0 * w.out);
    }
}
#endif

}  // namespace tidegate_blocks
