// The AVX2 vector type of k_blocks_kernel.h (one group of 8 rows in 256 bits), included like it inside an unnamed
// namespace with K_TARGET defined: by k_blocks.cpp for AVX2, and by k_blocks_avx512.cpp, whose 256-bit VNNI path
// replaces only its dot products.
// One group (8 rows) in a 256-bit vector.
struct Avx2 {
  using I = __m256i;
  using F = __m256;
  static constexpr int64_t kGroups = 1;
  // Activation rows a tile multiplies: R accumulators and the slice fit 16 registers.
  static constexpr int tile_rows(KKind) { return 4; }
  static constexpr bool kFloatQ6 = false;  // Q6_K's scales taken in integers (k_tile)
  static constexpr bool kPackTiles = false;  // 4 row pointers fit the general registers
  static constexpr bool kBroadcastDot = false;
  K_TARGET static I load(const uint8_t* const* p, int64_t off) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[0] + off));
  }
  K_TARGET static F halves(const uint8_t* const* p, int64_t off) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0] + off)));
  }
  K_TARGET static F u8_to_ps(const uint8_t* const* p, int64_t off) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[0] + off))));
  }
  K_TARGET static I i8_to_i32(const uint8_t* const* p, int64_t off) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[0] + off)));
  }
  K_TARGET static I bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  K_TARGET static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  K_TARGET static I zero_si() { return _mm256_setzero_si256(); }
  K_TARGET static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  K_TARGET static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  template <int N> K_TARGET static I slli16(I v) { return _mm256_slli_epi16(v, N); }
  template <int N> K_TARGET static I srli16(I v) { return _mm256_srli_epi16(v, N); }
  template <int N> K_TARGET static I slli32(I v) { return _mm256_slli_epi32(v, N); }
  K_TARGET static I add32(I a, I b) { return _mm256_add_epi32(a, b); }
  K_TARGET static I sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  K_TARGET static I mullo32(I a, I b) { return _mm256_mullo_epi32(a, b); }
  // acc + the 4-value u8 x s8 dot products of each int32 lane (pair sums fit int16: at most 2 * 63 * 127).
  K_TARGET static I dot(I acc, I u, I s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  // Two of them at once, added in int16 first (Q4_K, Q5_K: at most 4 * 31 * 127 fits).
  K_TARGET static I dot2(I acc, I u, I s, I u2, I s2) {
    const I pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u, s), _mm256_maddubs_epi16(u2, s2));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  K_TARGET static F zero_ps() { return _mm256_setzero_ps(); }
  K_TARGET static F set1_ps(float v) { return _mm256_set1_ps(v); }
  K_TARGET static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  K_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  K_TARGET static F add_ps(F a, F b) { return _mm256_add_ps(a, b); }
  K_TARGET static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  K_TARGET static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  K_TARGET static void store(F v, float* y, int64_t g, int64_t, int64_t out) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (int64_t o = g * 8; o < std::min(out, g * 8 + 8); ++o) y[o] = lanes[o - g * 8];
  }
};

