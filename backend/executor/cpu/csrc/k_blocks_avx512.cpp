// The AVX-512 path of the K-quant products (k_blocks.cpp). Many activation rows (prefill): k_blocks_kernel.h over
// 512-bit vectors, each holding two groups (16 output rows) side by side, so that every broadcast activation slice
// meets twice the weights of the AVX2 path (1.3-2x the AVX2 path's speed on weights in cache). Few rows (decode,
// the weights streamed from memory): one group in 256 bits. The many-row path multiplies tiles of 8 rows (32
// registers), packed block by block, with the activations broadcast by dpbusd's own load and Q6_K's scales taken
// in float (k_blocks_kernel.h): 1.07x (Q4_K) and 1.3x (Q6_K) the speed of 4-row tiles on one Zen 4 core. With VNNI one dpbusd does what maddubs, madd and add
// do; without it (AVX-512 BW only) those three run on 512 bits, and few rows take the AVX2 path. Chosen at run
// time (k_blocks.cpp); nothing here runs on a CPU without AVX-512 F, BW, VL and DQ.
#include <torch/extension.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "k_blocks.h"

namespace tidegate_k {

#if defined(__x86_64__)
namespace {
namespace bw {
#define K_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// Two groups: group g's 8 rows in lanes 0-7, group g + 1's in lanes 8-15 (each 32-byte slice loaded from its own).
struct V512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int64_t kGroups = 2;
  // 32 registers: 12 rows' block sums and accumulators with the slice and its constants (Q6_K: two sums a row,
  // 8 rows), so each weight slice is loaded and unpacked (its shifts and inserts take dpbusd's pipes) once for
  // 24 (16) dot products, not 8 as at 4 rows.
  static constexpr int tile_rows(KKind k) { return k == Q6_K ? 8 : 12; }
  static constexpr bool kFloatQ6 = true;
  static constexpr bool kPackTiles = true;
  static constexpr bool kBroadcastDot = false;
  K_TARGET static __m128i two_halves(const uint8_t* const* p, int64_t off) {  // 8 bytes from each group
    return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[0] + off)),
                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[1] + off)));
  }
  K_TARGET static I load(const uint8_t* const* p, int64_t off) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[0] + off));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[1] + off));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  K_TARGET static F halves(const uint8_t* const* p, int64_t off) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0] + off));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[1] + off));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
  }
  K_TARGET static F u8_to_ps(const uint8_t* const* p, int64_t off) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(two_halves(p, off)));
  }
  K_TARGET static I i8_to_i32(const uint8_t* const* p, int64_t off) { return _mm512_cvtepi8_epi32(two_halves(p, off)); }
  K_TARGET static I bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  K_TARGET static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  K_TARGET static I zero_si() { return _mm512_setzero_si512(); }
  K_TARGET static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  K_TARGET static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  template <int N> K_TARGET static I slli16(I v) { return _mm512_slli_epi16(v, N); }
  template <int N> K_TARGET static I srli16(I v) { return _mm512_srli_epi16(v, N); }
  template <int N> K_TARGET static I slli32(I v) { return _mm512_slli_epi32(v, N); }
  K_TARGET static I add32(I a, I b) { return _mm512_add_epi32(a, b); }
  K_TARGET static I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
  K_TARGET static I mullo32(I a, I b) { return _mm512_mullo_epi32(a, b); }
  K_TARGET static I dot(I acc, I u, I s) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
  K_TARGET static I dot2(I acc, I u, I s, I u2, I s2) {
    const I pairs = _mm512_add_epi16(_mm512_maddubs_epi16(u, s), _mm512_maddubs_epi16(u2, s2));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
  }
  K_TARGET static F zero_ps() { return _mm512_setzero_ps(); }
  K_TARGET static F set1_ps(float v) { return _mm512_set1_ps(v); }
  K_TARGET static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  K_TARGET static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  K_TARGET static F add_ps(F a, F b) { return _mm512_add_ps(a, b); }
  K_TARGET static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  K_TARGET static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  K_TARGET static void store(F v, float* y, int64_t g, int64_t count, int64_t out) {
    const int64_t first = g * 8, valid = (out - first) < 8 * count ? out - first : 8 * count;
    _mm512_mask_storeu_ps(y + first, static_cast<__mmask16>((1u << valid) - 1), v);
  }
};

#include "k_blocks_kernel.h"
#undef K_TARGET
}  // namespace bw

namespace vnni {
#define K_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

struct V512 : bw::V512 {
  static constexpr bool kBroadcastDot = true;
  // acc + u . (the 4 bytes at s, broadcast): GCC does not fold the broadcast into dpbusd's memory operand, and
  // a separate vpbroadcastd a dot product was a third of the loop's instructions.
  K_TARGET static I dot_bcast(I acc, I u, const int8_t* s) {
    asm("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*reinterpret_cast<const int32_t*>(s)), "v"(u));
    return acc;
  }
  K_TARGET static I dot(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  K_TARGET static I dot2(I acc, I u, I s, I u2, I s2) { return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, u, s), u2, s2); }
};

#include "k_blocks_kernel.h"
#undef K_TARGET
}  // namespace vnni

namespace vnni256 {
#define K_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#include "k_blocks_avx2.h"

// One group in 256 bits, as the AVX2 path, with VNNI's dpbusd: decode products stream the weights from memory,
// where two groups a vector (two streams a thread) measured 2x slower than one.
struct V256 : Avx2 {
  K_TARGET static I dot(I acc, I u, I s) { return _mm256_dpbusd_epi32(acc, u, s); }
  K_TARGET static I dot2(I acc, I u, I s, I u2, I s2) { return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u, s), u2, s2); }
};

#include "k_blocks_kernel.h"
#undef K_TARGET
}  // namespace vnni256
}  // namespace

bool cpu_has_avx512() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return supported;
}

bool cpu_has_vnni() {
  static const bool supported = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  return supported;
}

void k_rows_avx512(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin,
                   int64_t end) {
  if (rows <= kWideRows) {
    if (cpu_has_vnni()) return vnni256::k_rows<vnni256::V256>(w, x, rows, split, y, begin, end);
    return k_rows_avx2(w, x, rows, split, y, begin, end);
  }
  if (cpu_has_vnni()) return vnni::k_rows<vnni::V512>(w, x, rows, split, y, begin, end);
  bw::k_rows<bw::V512>(w, x, rows, split, y, begin, end);
}
#else
bool cpu_has_avx512() { return false; }
bool cpu_has_vnni() { return false; }
void k_rows_avx512(const KMatrix&, const KRows&, int64_t, bool, float*, int64_t, int64_t) { TORCH_CHECK(false, "no AVX-512"); }
#endif

}  // namespace tidegate_k
