// The many-rows paths of block_matmul.cpp, as GEMMs.
//
// Exact (float32) products, on AVX2: 16 output rows are dequantized once into a k-major panel, and tiles of 6
// activation rows are multiplied with it by broadcast and FMA into 6 x 2 vector accumulators.
//
// Products with 8- or 16-bit activations (a weight's decode_activations), on AVX-512 VNNI: the rows are quantized
// per 32-value block as the decode path quantizes them, 32 output rows are repacked once into a wide panel whose
// vectors hold, in each row's int32 lane, the row's values at 2 (int16) or 4 (uint8) consecutive positions, and
// tiles of 6 activation rows meet it through vpdpwssd (16-bit: 2 products a lane) or vpdpbusd (8-bit: 4 a lane)
// with their values broadcast, into 6 x 2 int32 accumulators per block. A block's sums are converted once and
// added with one FMA by the weight scale times the activation scale, and one more adds the minimum term
// m * dx * sum(q). vpdpbusd multiplies unsigned bytes by signed ones, so the 8-bit panel holds Q4 nibbles as they
// are (0..15) and Q8_0 values plus 128, and their offsets move into the minimum term: -8 d (Q4_0), -128 d (Q8_0).
// The integers are exact; the sums equal block_integer_dot.cpp's up to the order of the float32 additions.
#include "block_format.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tidegate_blocks {

#if defined(__x86_64__)
namespace {

constexpr int64_t kRowTile = 6;  // activation rows per GEMM tile: 6 x 2 accumulators, 15 of 16 ymm registers in use
constexpr int64_t kGroupBytes = 192 * 1024;  // panels dequantized together, sized to stay in a 512 KB L2

// Output rows [o, o + kPanel) dequantized k-major: panel[k * kPanel + j] is weight (o + j, k); rows past the
// matrix's last are zeros. A k step of the GEMM then reads kPanel consecutive weights: two vector loads. The
// interleaved layout already holds each group's rows side by side, so no transpose is needed.
AVX2_TARGET void dequantize_panel_avx2(const Matrix& w, int64_t o, float* panel) {
  for (int64_t half = 0; half < kPanel / kGroup; ++half) {
    const int64_t g = o / kGroup + half;
    for (int64_t b = 0; b < w.blocks(); ++b) {
      float* dst = panel + b * kBlock * kPanel + kGroup * half;
      if (g < w.groups()) {
        dequantize_group_avx2(w, g, b, dst, kPanel);
      } else {
        for (int64_t k = 0; k < kBlock; ++k) _mm256_storeu_ps(dst + k * kPanel, _mm256_setzero_ps());
      }
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

}  // namespace

// Many rows, as a GEMM: the thread's panels [begin, end) are dequantized a group at a time into a scratch that
// stays in L2, and every tile of kRowTile activation rows (in L1) runs through each panel of the group.
AVX2_TARGET void many_rows_avx2(const Matrix& w, const float* x, int64_t rows, float* y, int64_t begin, int64_t end) {
  const int64_t out_features = w.out;
  const int64_t panel_values = kPanel * w.in;
  const int64_t group = std::max<int64_t>(1, kGroupBytes / (panel_values * int64_t{sizeof(float)}));
  std::vector<float> scratch(group * panel_values);
  for (int64_t g = begin; g < end; g += group) {
    const int64_t panels = std::min(end, g + group) - g;
    for (int64_t p = 0; p < panels; ++p)
      dequantize_panel_avx2(w, (g + p) * kPanel, scratch.data() + p * panel_values);
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

namespace {

constexpr int64_t kVnniRowTile = 6;  // 6 rows x 2 vectors: 12 int32 and 12 float32 accumulators of 32 zmm registers

// A wide panel of kWidePanel output rows, block after block: the quants as kSteps steps of two vectors (rows 0-15,
// then 16-31; each vector the 32 bytes of 4 groups' 8 lanes), then the 32 rows' scales and minimum terms as float32.
template <int Bits>
struct Wide {
  static constexpr int64_t kValues = Bits == 16 ? 2 : 4;  // consecutive positions in a lane
  static constexpr int64_t kSteps = kBlock / kValues;
  static constexpr int64_t kStepBytes = 2 * 64;
  static constexpr int64_t kQuantBytes = kSteps * kStepBytes;
  static constexpr int64_t kBlockBytes = kQuantBytes + 2 * kWidePanel * int64_t{sizeof(float)};
};

AVX512_TARGET inline __m128i load16(const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
AVX512_TARGET inline void store32(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// Block b of group g into its 8 lanes of each step (`lanes`, steps kStepBytes apart), and its scales and minimum
// terms into d and mn.
template <int Bits>
AVX512_TARGET void pack_group(const Matrix& w, int64_t g, int64_t b, uint8_t* lanes, float* d, float* mn) {
  using L = Wide<Bits>;
  const uint8_t* q = w.group_block(g, b);
  const int64_t at = (g * w.blocks() + b) * kGroup;
  const __m256 scale = _mm256_cvtph_ps(load16(w.scales + at));
  __m256 minimum = w.kind == Q4_1 ? _mm256_cvtph_ps(load16(w.mins + at)) : _mm256_setzero_ps();
  if (Bits == 8 && w.kind != Q4_1)
    minimum = _mm256_mul_ps(scale, _mm256_set1_ps(w.kind == Q4_0 ? -8.0f : (w.kind == Q5_0 ? -16.0f : -128.0f)));
  _mm256_storeu_ps(d, scale);
  _mm256_storeu_ps(mn, minimum);
  if constexpr (Bits == 16) {
    // A 16-byte unit holds positions 2u and 2u + 1 of each of the 8 rows side by side: widened, a step's lanes.
    if (w.kind == Q8_0) {
      for (int64_t u = 0; u < L::kSteps; ++u) store32(lanes + u * L::kStepBytes, _mm256_cvtepi8_epi16(load16(q + 16 * u)));
      return;
    }
    if (w.kind == Q5_0) {  // the values with their fifth bits, minus 16, as signed bytes
      for (int64_t u = 0; u < L::kSteps / 2; ++u) {
        const Nibbles values = unit_values(q, u, Q5_0);
        store32(lanes + u * L::kStepBytes, _mm256_cvtepi8_epi16(values.low));
        store32(lanes + (u + L::kSteps / 2) * L::kStepBytes, _mm256_cvtepi8_epi16(values.high));
      }
      return;
    }
    const __m256i low4 = _mm256_set1_epi16(15), offset = _mm256_set1_epi16(w.kind == Q4_0 ? 8 : 0);
    for (int64_t u = 0; u < L::kSteps / 2; ++u) {  // low nibbles: positions 2u, 2u + 1; high: 16 more
      const __m256i words = _mm256_cvtepu8_epi16(load16(q + 16 * u));
      store32(lanes + u * L::kStepBytes, _mm256_sub_epi16(_mm256_and_si256(words, low4), offset));
      store32(lanes + (u + L::kSteps / 2) * L::kStepBytes,
              _mm256_sub_epi16(_mm256_and_si256(_mm256_srli_epi16(words, 4), low4), offset));
    }
  } else {
    // Units 2t and 2t + 1 hold positions 4t..4t+3 (Q8_0), or their nibbles 4t..4t+3 and 4t+16..4t+19 (Q4):
    // interleaved by 16 bits, row i's 4 bytes come together in lane i.
    const int64_t pairs = w.kind == Q8_0 ? L::kSteps : L::kSteps / 2;
    const __m256i low4 = _mm256_set1_epi8(15), flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t t = 0; t < pairs; ++t) {
      const __m128i a = load16(q + 32 * t), c = load16(q + 32 * t + 16);
      const __m256i quads = _mm256_set_m128i(_mm_unpackhi_epi16(a, c), _mm_unpacklo_epi16(a, c));
      if (w.kind == Q8_0) {
        store32(lanes + t * L::kStepBytes, _mm256_xor_si256(quads, flip));  // signed to unsigned: plus 128
        continue;
      }
      __m256i low = _mm256_and_si256(quads, low4), high = _mm256_and_si256(_mm256_srli_epi16(quads, 4), low4);
      if (w.kind == Q5_0) {  // the fifth bits of units 2t and 2t + 1, interleaved as the quants (values 0..31)
        const Nibbles fa = fifth_of_unit(q, 2 * t), fc = fifth_of_unit(q, 2 * t + 1);
        low = _mm256_or_si256(low, _mm256_set_m128i(_mm_unpackhi_epi16(fa.low, fc.low), _mm_unpacklo_epi16(fa.low, fc.low)));
        high = _mm256_or_si256(high,
                               _mm256_set_m128i(_mm_unpackhi_epi16(fa.high, fc.high), _mm_unpacklo_epi16(fa.high, fc.high)));
      }
      store32(lanes + t * L::kStepBytes, low);
      store32(lanes + (t + pairs) * L::kStepBytes, high);
    }
  }
}

// Wide panel p (output rows [32 p, 32 p + 32), zeros past the matrix's last) packed into dst.
template <int Bits>
AVX512_TARGET void pack_wide(const Matrix& w, int64_t p, uint8_t* dst) {
  using L = Wide<Bits>;
  for (int64_t b = 0; b < w.blocks(); ++b) {
    uint8_t* block = dst + b * L::kBlockBytes;
    float* d = reinterpret_cast<float*>(block + L::kQuantBytes);
    for (int64_t quarter = 0; quarter < kWidePanel / kGroup; ++quarter) {
      const int64_t g = p * (kWidePanel / kGroup) + quarter;
      uint8_t* lanes = block + quarter * 32;
      if (g < w.groups()) {
        pack_group<Bits>(w, g, b, lanes, d + kGroup * quarter, d + kWidePanel + kGroup * quarter);
        continue;
      }
      for (int64_t step = 0; step < L::kSteps; ++step) store32(lanes + step * L::kStepBytes, _mm256_setzero_si256());
      _mm256_storeu_ps(d + kGroup * quarter, _mm256_setzero_ps());
      _mm256_storeu_ps(d + kWidePanel + kGroup * quarter, _mm256_setzero_ps());
    }
  }
}

// The quantized activation rows a tile reads: values (int16, or int8 for 8-bit activations) `row_bytes` apart,
// and per row and block the scale d and d * sum(q).
struct RowTile {
  const uint8_t* q;
  int64_t row_bytes;
  const float* d;
  const float* s;
};

// R activation rows times one wide panel, every block's integer sums scaled into 2R float32 accumulators.
template <int Bits, int R>
AVX512_TARGET void wide_tile(const uint8_t* panel, const RowTile& x, int64_t blocks, bool with_min, float* y,
                             int64_t out_features, int64_t valid) {
  using L = Wide<Bits>;
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + b * L::kBlockBytes;
    const uint8_t* xb = x.q + b * kBlock * (Bits / 8);
    __m512i dot[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int64_t step = 0; step < L::kSteps; ++step) {
      const __m512i w0 = _mm512_loadu_si512(block + step * L::kStepBytes);
      const __m512i w1 = _mm512_loadu_si512(block + step * L::kStepBytes + 64);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t values;  // this row's 2 int16 or 4 int8 values at the step's positions
        std::memcpy(&values, xb + r * x.row_bytes + step * 4, sizeof values);
        const __m512i xv = _mm512_set1_epi32(values);
        if constexpr (Bits == 16) {
          dot[r][0] = _mm512_dpwssd_epi32(dot[r][0], w0, xv);
          dot[r][1] = _mm512_dpwssd_epi32(dot[r][1], w1, xv);
        } else {
          dot[r][0] = _mm512_dpbusd_epi32(dot[r][0], w0, xv);
          dot[r][1] = _mm512_dpbusd_epi32(dot[r][1], w1, xv);
        }
      }
    }
    const float* scales = reinterpret_cast<const float*>(block + L::kQuantBytes);
    const __m512 d0 = _mm512_loadu_ps(scales), d1 = _mm512_loadu_ps(scales + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(x.d[r * blocks + b]);
      acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][0]), _mm512_mul_ps(d0, dx), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][1]), _mm512_mul_ps(d1, dx), acc[r][1]);
    }
    if (with_min) {
      const __m512 m0 = _mm512_loadu_ps(scales + kWidePanel), m1 = _mm512_loadu_ps(scales + kWidePanel + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 sx = _mm512_set1_ps(x.s[r * blocks + b]);
        acc[r][0] = _mm512_fmadd_ps(m0, sx, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(m1, sx, acc[r][1]);
      }
    }
  }
  // A wide panel past the last output row: only `valid` outputs are stored.
  const __mmask16 low = valid >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
  const __mmask16 high = valid >= 32 ? 0xFFFF : static_cast<__mmask16>(valid > 16 ? (1u << (valid - 16)) - 1 : 0);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * out_features, low, acc[r][0]);
    _mm512_mask_storeu_ps(y + r * out_features + 16, high, acc[r][1]);
  }
}

using WideTile = void (*)(const uint8_t*, const RowTile&, int64_t, bool, float*, int64_t, int64_t);
template <int Bits>
constexpr WideTile kWideTiles[kVnniRowTile + 1] = {nullptr, wide_tile<Bits, 1>, wide_tile<Bits, 2>,
                                                   wide_tile<Bits, 3>, wide_tile<Bits, 4>, wide_tile<Bits, 5>,
                                                   wide_tile<Bits, 6>};

// The thread's wide panels [begin, end), packed a group at a time into a scratch that stays in L2, every tile of
// activation rows running through each panel of the group (as many_rows_avx2).
template <int Bits>
AVX512_TARGET void many_rows_wide(const Matrix& w, const QuantizedRows& x, const int8_t* x8, int64_t rows, float* y,
                                  int64_t begin, int64_t end) {
  const int64_t blocks = w.blocks(), panel_bytes = blocks * Wide<Bits>::kBlockBytes;
  const int64_t group = std::max<int64_t>(1, kGroupBytes / panel_bytes);
  const bool with_min = Bits == 8 || w.kind == Q4_1;
  const uint8_t* values = Bits == 16 ? reinterpret_cast<const uint8_t*>(x.q) : reinterpret_cast<const uint8_t*>(x8);
  const int64_t row_bytes = w.in * (Bits / 8);
  std::vector<uint8_t> scratch(group * panel_bytes);
  for (int64_t g = begin; g < end; g += group) {
    const int64_t panels = std::min(end, g + group) - g;
    for (int64_t p = 0; p < panels; ++p) pack_wide<Bits>(w, g + p, scratch.data() + p * panel_bytes);
    for (int64_t r0 = 0, tile = 0; r0 < rows; r0 += tile) {
      const int64_t left = rows - r0;
      tile = left > kVnniRowTile && left < 2 * kVnniRowTile ? (left + 1) / 2 : std::min(kVnniRowTile, left);
      const RowTile xt{values + r0 * row_bytes, row_bytes, x.d + r0 * blocks, x.s + r0 * blocks};
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t o = (g + p) * kWidePanel;
        kWideTiles<Bits>[tile](scratch.data() + p * panel_bytes, xt, blocks, with_min, y + r0 * w.out + o, w.out,
                               std::min(kWidePanel, w.out - o));
      }
    }
  }
}

}  // namespace

AVX512_TARGET void many_rows_vnni(const Matrix& w, const QuantizedRows& x, const int8_t* x8, int64_t rows, float* y,
                                  int64_t begin, int64_t end) {
  if (x8 != nullptr) return many_rows_wide<8>(w, x, x8, rows, y, begin, end);
  many_rows_wide<16>(w, x, x8, rows, y, begin, end);
}

AVX512_TARGET void narrow_to_int8(const int16_t* q, int64_t n, int8_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi16_epi8(_mm512_loadu_si512(q + i)));
  for (; i < n; ++i) out[i] = static_cast<int8_t>(q[i]);
}
#endif

}  // namespace tidegate_blocks
