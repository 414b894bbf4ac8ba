// The few-rows path of block_matmul.cpp in integer arithmetic, as llama.cpp multiplies a decode step: each
// activation row is quantized once per product into 32-value blocks (a float scale dx = max|x| / L, the values
// round(x / dx) to nearest even, and dx * their sum for Q4_1's minimum term), and every weight block meets it
// in an integer dot product. L is 127 for 8-bit activations (llama.cpp's quantize_row_q8_1) or 32767 for
// 16-bit ones. The AVX2 path forms 8 int32 lanes per block and row: 8-bit by maddubs (unsigned weight nibbles,
// or |w| against x carrying w's sign for Q8_0 and Q4_0's q - 8) and madd with ones; 16-bit by two madds of
// the weights widened to int16 with x. Either converts the lanes and adds them with one FMA by d * dx: 6 to 7
// instructions a block and row instead of the ~30 of dequantizing to float32 and 8 FMAs. Q4_1 adds
// m * dx * sum(x) per block. The weights stay the file's values; only the activations are rounded. The scalar
// path computes the same integers.
#include "block_format.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace tidegate_blocks {

namespace {

template <typename T>
constexpr float kLevels = std::is_same_v<T, int8_t> ? 127.0f : 32767.0f;  // largest |q| of a block
// Blocks whose largest |x| is below this round to zeros: kLevels / amax would overflow to infinity near 1e-34.
constexpr float kSmallestBlock = 1e-30f;

// Weight block b of output row o against the block's quantized activations: their integer dot product.
template <typename T>
int32_t dot_scalar(const Matrix& w, int64_t o, int64_t b, const T* xq) {
  int32_t dot = 0;
  if (w.kind == Q8_0) {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.quants + o * w.row_bytes() + b * kBlock);
    for (int j = 0; j < kBlock; ++j) dot += q[j] * xq[j];
    return dot;
  }
  const uint8_t* q = w.quants + o * w.row_bytes() + b * (kBlock / 2);
  const int offset = w.kind == Q4_0 ? 8 : 0;
  for (int j = 0; j < kBlock / 2; ++j) dot += ((q[j] & 15) - offset) * xq[j] + ((q[j] >> 4) - offset) * xq[j + 16];
  return dot;
}

}  // namespace

template <typename T>
void quantize_rows_scalar(const float* x, int64_t rows, int64_t in, const QuantizedRows<T>& out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kBlock; ++b) {
      const float* v = x + r * in + b * kBlock;
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float id = amax >= kSmallestBlock ? kLevels<T> / amax : 0.0f;  // an all-zero block: values 0
      T* q = out.q + r * in + b * kBlock;
      int sum = 0;
      for (int j = 0; j < kBlock; ++j) {
        q[j] = static_cast<T>(std::nearbyint(v[j] * id));  // the default rounding mode: to nearest even
        sum += q[j];
      }
      const int64_t i = r * (in / kBlock) + b;
      out.d[i] = amax / kLevels<T>;
      out.s[i] = out.d[i] * static_cast<float>(sum);
    }
}

template <typename T>
void integer_rows_scalar(const Matrix& w, const QuantizedRows<T>& x, int64_t rows, float* y, int64_t out_features,
                         int64_t begin, int64_t end) {
  const int64_t nb = w.blocks();
  for (int64_t o = begin; o < end; ++o)
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i = r * nb + b;
        const float d = static_cast<float>(w.scales[o * nb + b]);
        acc += d * x.d[i] * static_cast<float>(dot_scalar(w, o, b, x.q + r * w.in + b * kBlock));
        if (w.kind == Q4_1) acc += static_cast<float>(w.mins[o * nb + b]) * x.s[i];
      }
      y[r * out_features + o] = acc;
    }
}

template void quantize_rows_scalar(const float*, int64_t, int64_t, const QuantizedRows<int8_t>&);
template void quantize_rows_scalar(const float*, int64_t, int64_t, const QuantizedRows<int16_t>&);
template void integer_rows_scalar(const Matrix&, const QuantizedRows<int8_t>&, int64_t, float*, int64_t, int64_t,
                                  int64_t);
template void integer_rows_scalar(const Matrix&, const QuantizedRows<int16_t>&, int64_t, float*, int64_t, int64_t,
                                  int64_t);

#if defined(__x86_64__)
namespace {

AVX2_TARGET inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

AVX2_TARGET inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// A weight block unpacked once for every row of a tile: for 8-bit activations its 32 values as bytes (Q4_1
// unsigned, Q4_0 and Q8_0 signed) and their magnitudes (maddubs takes unsigned weights); for 16-bit ones the
// values widened to int16, the first 16 and the last 16.
struct Unpacked {
  __m256i first, second;
};

template <Kind K, typename T>
AVX2_TARGET inline Unpacked unpack(const uint8_t* q) {
  if constexpr (std::is_same_v<T, int8_t>) {
    __m256i values;
    if (K == Q8_0) {
      values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      values = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
      if (K == Q4_0) values = _mm256_sub_epi8(values, _mm256_set1_epi8(8));
    }
    return {values, K == Q4_1 ? values : _mm256_sign_epi8(values, values)};
  } else {
    if (K == Q8_0)
      return {_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))};
    // Byte j widened to a word holds value j in its low nibble and value j + 16 in its high one.
    const __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    Unpacked w{_mm256_and_si256(words, _mm256_set1_epi16(15)), _mm256_srli_epi16(words, 4)};
    if (K == Q4_0) {
      w.first = _mm256_sub_epi16(w.first, _mm256_set1_epi16(8));
      w.second = _mm256_sub_epi16(w.second, _mm256_set1_epi16(8));
    }
    return w;
  }
}

// The 8 int32 lanes of an unpacked weight block times one row's quantized block (each lane sums 4 products).
template <Kind K, typename T>
AVX2_TARGET inline __m256i lanes(const Unpacked& w, const T* xq) {
  const __m256i* x = reinterpret_cast<const __m256i*>(xq);
  if constexpr (std::is_same_v<T, int8_t>) {
    __m256i xr = _mm256_loadu_si256(x);
    if (K != Q4_1) xr = _mm256_sign_epi8(xr, w.first);  // x carries w's sign, so |w| * x = w * x
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.second, xr), _mm256_set1_epi16(1));
  } else {
    return _mm256_add_epi32(_mm256_madd_epi16(w.first, _mm256_loadu_si256(x)),
                            _mm256_madd_epi16(w.second, _mm256_loadu_si256(x + 1)));
  }
}

constexpr int64_t kChunk = 32;  // blocks whose combined scales d * dx are prepared together, in L1

// One weight block (its bytes at q) against the R rows' quantized blocks at xq (rows `in` apart), each row's
// lanes scaled by its d * dx from `scale` (rows kChunk apart) into accumulator a.
template <Kind K, typename T, int R, int A>
AVX2_TARGET __attribute__((always_inline)) inline void block_avx2(const uint8_t* q, const T* xq, int64_t in,
                                                                  const float* scale, __m256 (&acc)[R][A], int a) {
  const Unpacked w = unpack<K, T>(q);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    acc[r][a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes<K, T>(w, xq + r * in)),
                                _mm256_broadcast_ss(scale + r * kChunk), acc[r][a]);
}

// One output row against a tile of R quantized rows. Per chunk of blocks, the products d * dx of every row
// and block are computed 8 at a time (and Q4_1's m * dx * sum(x) summed), so the block loop only broadcasts
// them. A accumulators per row keep enough FMAs in flight when the tile is short.
template <Kind K, typename T, int R>
AVX2_TARGET void tile_avx2(const Matrix& w, int64_t o, const QuantizedRows<T>& x, float* y, int64_t out_features) {
  constexpr int A = R <= 2 ? 2 : 1;
  constexpr int64_t kBlockBytes = K == Q8_0 ? kBlock : kBlock / 2;
  const int64_t nb = w.blocks(), in = w.in;
  const uint8_t* q = w.quants + o * nb * kBlockBytes;
  const c10::Half* d = w.scales + o * nb;
  const c10::Half* m = K == Q4_1 ? w.mins + o * nb : nullptr;
  alignas(32) float scale[R][kChunk];
  __m256 acc[R][A], minimum[R];
  float minimum_tail[R] = {};
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    minimum[r] = _mm256_setzero_ps();
    for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < nb; c += kChunk) {
    const int64_t n = std::min(kChunk, nb - c);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + c + j)));
      for (int r = 0; r < R; ++r) _mm256_store_ps(scale[r] + j, _mm256_mul_ps(dw, _mm256_loadu_ps(x.d + r * nb + c + j)));
      if (K == Q4_1) {
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + c + j)));
        for (int r = 0; r < R; ++r) minimum[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x.s + r * nb + c + j), minimum[r]);
      }
    }
    for (; j < n; ++j)
      for (int r = 0; r < R; ++r) {
        scale[r][j] = half_to_float(d[c + j]) * x.d[r * nb + c + j];
        if (K == Q4_1) minimum_tail[r] += half_to_float(m[c + j]) * x.s[r * nb + c + j];
      }
    const uint8_t* qc = q + c * kBlockBytes;
    const T* xc = x.q + c * kBlock;
    int64_t b = 0;
    for (; b + A <= n; b += A)
#pragma GCC unroll 2
      for (int a = 0; a < A; ++a)
        block_avx2<K, T, R, A>(qc + (b + a) * kBlockBytes, xc + (b + a) * kBlock, in, &scale[0][b + a], acc, a);
    for (; b < n; ++b) block_avx2<K, T, R, A>(qc + b * kBlockBytes, xc + b * kBlock, in, &scale[0][b], acc, 0);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m256 total = acc[r][0];
    for (int a = 1; a < A; ++a) total = _mm256_add_ps(total, acc[r][a]);
    y[r * out_features + o] = hsum(total) + (K == Q4_1 ? hsum(minimum[r]) + minimum_tail[r] : 0.0f);
  }
}

template <typename T>
using Tile = void (*)(const Matrix&, int64_t, const QuantizedRows<T>&, float*, int64_t);

template <Kind K, typename T>
constexpr Tile<T> kTiles[kFewRows + 1] = {nullptr, tile_avx2<K, T, 1>, tile_avx2<K, T, 2>, tile_avx2<K, T, 3>,
                                          tile_avx2<K, T, 4>, tile_avx2<K, T, 5>, tile_avx2<K, T, 6>,
                                          tile_avx2<K, T, 7>, tile_avx2<K, T, 8>};

// 32 int32 values (in four vectors) saturated to T and stored in order.
AVX2_TARGET inline void store_packed(const __m256i q[4], int8_t* out) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the lane interleaving of the packs
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(packed, order));
}

AVX2_TARGET inline void store_packed(const __m256i q[4], int16_t* out) {
  for (int i = 0; i < 2; ++i)  // the pack interleaves 128-bit lanes; the permute puts them back in order
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * i),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * i], q[2 * i + 1]), 0xD8));
}

}  // namespace

template <typename T>
AVX2_TARGET void quantize_rows_avx2(const float* x, int64_t rows, int64_t in, const QuantizedRows<T>& out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < in / kBlock; ++b) {
      const float* v = x + r * in + b * kBlock;
      __m256 f[4];
      for (int i = 0; i < 4; ++i) f[i] = _mm256_loadu_ps(v + 8 * i);
      const __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, f[0]), _mm256_andnot_ps(sign, f[1])),
                                     _mm256_max_ps(_mm256_andnot_ps(sign, f[2]), _mm256_andnot_ps(sign, f[3])));
      const float amax = hmax(a);
      const __m256 id = _mm256_set1_ps(amax >= kSmallestBlock ? kLevels<T> / amax : 0.0f);
      __m256i q[4];
      for (int i = 0; i < 4; ++i)
        q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(f[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
      store_packed(q, out.q + r * in + b * kBlock);
      const int64_t i = r * (in / kBlock) + b;
      out.d[i] = amax / kLevels<T>;
      out.s[i] = out.d[i] * static_cast<float>(sum);
    }
}

// Output rows [begin, end) against the quantized rows, at most kFewRows of them: one tile.
template <typename T>
AVX2_TARGET void integer_rows_avx2(const Matrix& w, const QuantizedRows<T>& x, int64_t rows, float* y,
                                   int64_t out_features, int64_t begin, int64_t end) {
  const Tile<T>* tiles = w.kind == Q8_0 ? kTiles<Q8_0, T> : (w.kind == Q4_0 ? kTiles<Q4_0, T> : kTiles<Q4_1, T>);
  for (int64_t o = begin; o < end; ++o) tiles[rows](w, o, x, y, out_features);
}

template void quantize_rows_avx2(const float*, int64_t, int64_t, const QuantizedRows<int8_t>&);
template void quantize_rows_avx2(const float*, int64_t, int64_t, const QuantizedRows<int16_t>&);
template void integer_rows_avx2(const Matrix&, const QuantizedRows<int8_t>&, int64_t, float*, int64_t, int64_t,
                                int64_t);
template void integer_rows_avx2(const Matrix&, const QuantizedRows<int16_t>&, int64_t, float*, int64_t, int64_t,
                                int64_t);
#endif

}  // namespace tidegate_blocks
