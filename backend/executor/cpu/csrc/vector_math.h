// AVX2+FMA+F16C helpers shared by all of the extension's kernels, and the one run-time choice of path for them;
// every caller keeps a scalar path, so nothing needs these (or AVX-512) to run. The block GEMM also has an
// AVX-512 VNNI path (block_gemm.cpp), chosen by the same switch.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tidegate_simd {

// Whether this CPU has AVX2, FMA and F16C (checked once; every AVX2 CPU has the other two).
inline bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return supported;
#else
  return false;
#endif
}

// Whether this CPU has AVX-512 F/BW/VL with VNNI (vpdpbusd, vpdpwssd) besides AVX2.
inline bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
  static const bool supported = cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512vnni");
  return supported;
#else
  return false;
#endif
}

// The widest instruction set the kernels may use: the CPU's, capped by TIDEGATE_CPU_ISA (scalar, avx2, avx512) at
// load, or by tests at run time, so that each path is exercised and timed on one machine.
enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2 };

inline int isa_from_environment() {
  const char* name = std::getenv("TIDEGATE_CPU_ISA");
  if (name == nullptr) return kAvx512Vnni;
  if (std::strcmp(name, "scalar") == 0) return kScalar;
  if (std::strcmp(name, "avx2") == 0) return kAvx2;
  return kAvx512Vnni;
}

inline std::atomic<int>& isa_limit() {
  static std::atomic<int> limit{isa_from_environment()};
  return limit;
}

inline bool use_avx2() { return cpu_has_avx2() && isa_limit().load() >= kAvx2; }
inline bool use_avx512_vnni() { return cpu_has_avx512_vnni() && isa_limit().load() >= kAvx512Vnni; }

inline void set_isa_limit(int isa) { isa_limit().store(isa); }

// Set by tests, so that the portable paths run on AVX2 machines too; one flag for every kernel of the extension.
// Turned off, it restores the limit of the environment.
inline void set_scalar_only(bool value) { set_isa_limit(value ? kScalar : isa_from_environment()); }

#if defined(__x86_64__)
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

AVX2_TARGET inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

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

// The 32 values at v loaded into f, and their largest magnitude: an activation block about to be quantized.
AVX2_TARGET inline float load_block_amax(const float* v, __m256 f[4]) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) f[i] = _mm256_loadu_ps(v + 8 * i);
  return hmax(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, f[0]), _mm256_andnot_ps(sign, f[1])),
                            _mm256_max_ps(_mm256_andnot_ps(sign, f[2]), _mm256_andnot_ps(sign, f[3]))));
}

// The block's values times id, rounded to nearest even (as std::nearbyint in the default mode), as int32.
AVX2_TARGET inline void round_block(const __m256 f[4], float id, __m256i q[4]) {
  const __m256 scale = _mm256_set1_ps(id);
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(f[i], scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// exp(x) for x <= 0 (scores minus their maximum): Cephes' degree-5 polynomial after a 2^n range reduction,
// within 2 ulp of std::exp; underflows to 0 below -87, as softmax needs.
AVX2_TARGET inline __m256 exp_nonpositive_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}
#endif

}  // namespace tidegate_simd
