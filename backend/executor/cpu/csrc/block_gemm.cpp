// The many-rows path of block_matmul.cpp, as a GEMM: 16 output rows are dequantized once into a k-major panel,
// and tiles of 6 activation rows are multiplied with it by broadcast and FMA into 6 x 2 vector accumulators.
#include "block_format.h"

#include <algorithm>
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
#endif

}  // namespace tidegate_blocks
