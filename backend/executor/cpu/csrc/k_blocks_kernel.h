// The integer product of K-quant groups (k_blocks.h's layout) with activation rows, written once over a vector
// type V and included by each file that compiles it for an instruction set: k_blocks.cpp (AVX2: V holds one group
// of 8 rows in 256 bits) and k_blocks_avx512.cpp (AVX-512: two groups, 16 rows, in 512 bits; VNNI's dpbusd where
// present). The includer defines K_TARGET (the target attribute of every function here) and includes this inside
// an unnamed namespace of its own, so each instruction set's copy stays in its file.
//
// Per 32-value block and row: a u8 x s8 dot product of each 4-value slice (maddubs then madd, or dpbusd) into the
// row's int32 lane, then one float FMA by d * scale * dx, and (Q4_K, Q5_K) one by dmin * minimum * dx * sum(q);
// Q6_K multiplies its two 16-value halves' sums by their int8 scales in integers, and takes 32 * scale * sum(q)
// off for its offset. Only the activations are rounded: the weights are the file's integers and scales.

template <int Shift, class V>
K_TARGET inline typename V::I shift16(typename V::I v) {  // left by Shift (right where negative), in 16-bit lanes
  if constexpr (Shift > 0) return V::template slli16<Shift>(v);
  if constexpr (Shift < 0) return V::template srli16<-Shift>(v);
  return v;
}

K_TARGET inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// Slice t of a block: values 4t..4t+3 (lo) and 16+4t..16+4t+3 (hi) of every row, as unsigned bytes.
template <class V, KKind K, int T>
K_TARGET inline void slice(const uint8_t* const* p, int64_t off, typename V::I& lo, typename V::I& hi) {
  const typename V::I raw = V::load(p, off + 32 * T), low4 = V::bytes(15);
  lo = V::and_(raw, low4);
  hi = V::and_(V::template srli16<4>(raw), low4);
  if constexpr (K == Q5_K) {
    const typename V::I bits = V::load(p, off + 128), bit4 = V::bytes(0x10);
    lo = V::or_(lo, V::and_(shift16<4 - T, V>(bits), bit4));
    hi = V::or_(hi, V::and_(shift16<-T, V>(bits), bit4));
  } else if constexpr (K == Q6_K) {
    const typename V::I two = V::bytes(0x30);
    lo = V::or_(lo, V::and_(shift16<4 - 2 * T, V>(V::load(p, off + 128)), two));
    hi = V::or_(hi, V::and_(shift16<4 - 2 * T, V>(V::load(p, off + 160)), two));
  }
}

template <class V, KKind K, int R, int T>
K_TARGET inline void slice_dots(const uint8_t* const* p, int64_t off, const int8_t* const* xq,
                                typename V::I* lo_dot, typename V::I* hi_dot) {
  typename V::I lo, hi;
  slice<V, K, T>(p, off, lo, hi);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const typename V::I xl = V::set1(four_bytes(xq[r] + 4 * T)), xh = V::set1(four_bytes(xq[r] + 16 + 4 * T));
    if constexpr (K == Q6_K) {
      lo_dot[r] = V::dot(lo_dot[r], lo, xl);
      hi_dot[r] = V::dot(hi_dot[r], hi, xh);
    } else {
      lo_dot[r] = V::dot2(lo_dot[r], lo, xl, hi, xh);
    }
  }
}

// V::kGroups groups from g (`count` of them real: a second one past the matrix repeats the first, unstored)
// against R activation rows; y is the tile's first row of outputs.
template <class V, KKind K, int R>
K_TARGET void k_tile(const KMatrix& w, int64_t g, int64_t count, const KRows& x, float* y) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kSuperBytes = super_bytes(K), kHeader = header_bytes(K), kBlockBytes = block_bytes(K);
  const int64_t in = w.in, supers = w.supers();
  const uint8_t* base[2] = {w.super(g, 0), w.super(count > 1 ? g + 1 : g, 0)};
  F acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = V::zero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* p[2] = {base[0] + s * kSuperBytes, base[1] + s * kSuperBytes};
    const F d = V::halves(p, 0);
    const F dmin = K == Q6_K ? V::zero_ps() : V::halves(p, 16);
    for (int64_t b = 0; b < 8; ++b) {
      const int64_t off = kHeader + b * kBlockBytes, k0 = s * kSuper + b * kSub;
      const int8_t* xq[R];
      I lo_dot[R], hi_dot[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        xq[r] = x.q + r * in + k0;
        lo_dot[r] = hi_dot[r] = V::zero_si();
      }
      slice_dots<V, K, R, 0>(p, off, xq, lo_dot, hi_dot);
      slice_dots<V, K, R, 1>(p, off, xq, lo_dot, hi_dot);
      slice_dots<V, K, R, 2>(p, off, xq, lo_dot, hi_dot);
      slice_dots<V, K, R, 3>(p, off, xq, lo_dot, hi_dot);
      const int64_t scales = off + 128 + bits_bytes(K);
      if constexpr (K == Q6_K) {
        const I sc_lo = V::i8_to_i32(p, scales), sc_hi = V::i8_to_i32(p, scales + 8);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int32_t* sums = x.sums + r * (in / 16) + k0 / 16;
          const I offset = V::add32(V::mullo32(sc_lo, V::set1(sums[0])), V::mullo32(sc_hi, V::set1(sums[1])));
          const I dot = V::sub32(V::add32(V::mullo32(lo_dot[r], sc_lo), V::mullo32(hi_dot[r], sc_hi)),
                                 V::template slli32<5>(offset));
          acc[r] = V::fmadd(V::cvt(dot), V::mul(d, V::set1_ps(x.dx[r * (in / kSub) + k0 / kSub])), acc[r]);
        }
      } else {
        const F ds = V::mul(d, V::u8_to_ps(p, scales)), ms = V::mul(dmin, V::u8_to_ps(p, scales + 8));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const float dx = x.dx[r * (in / kSub) + k0 / kSub];
          const int32_t* sums = x.sums + r * (in / 16) + k0 / 16;
          acc[r] = V::fmadd(V::cvt(lo_dot[r]), V::mul(ds, V::set1_ps(dx)), acc[r]);
          acc[r] = V::fnmadd(ms, V::set1_ps(dx * static_cast<float>(sums[0] + sums[1])), acc[r]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) V::store(acc[r], y + r * w.out, g, count, w.out);
}

constexpr int kTileRows = 4;  // activation rows a tile multiplies: R accumulators and the slice fit 16 registers

template <class V, KKind K>
K_TARGET void k_groups(const KMatrix& w, const KRows& x, int64_t rows, float* y, int64_t begin, int64_t end) {
  using Tile = void (*)(const KMatrix&, int64_t, int64_t, const KRows&, float*);
  constexpr Tile tiles[kTileRows + 1] = {nullptr, k_tile<V, K, 1>, k_tile<V, K, 2>, k_tile<V, K, 3>, k_tile<V, K, 4>};
  const int64_t in = w.in;
  for (int64_t g = begin; g < end; g += V::kGroups) {
    const int64_t count = end - g < V::kGroups ? end - g : V::kGroups;
    for (int64_t r0 = 0, tile = 0; r0 < rows; r0 += tile) {
      const int64_t left = rows - r0, passes = (left + kTileRows - 1) / kTileRows;
      tile = (left + passes - 1) / passes;  // even tiles: 5 rows run as 3 and 2
      const KRows part{x.q + r0 * in, x.dx + r0 * (in / kSub), x.sums + r0 * (in / 16)};
      tiles[tile](w, g, count, part, y + r0 * w.out);
    }
  }
}

template <class V>
K_TARGET void k_rows(const KMatrix& w, const KRows& x, int64_t rows, float* y, int64_t begin, int64_t end) {
  switch (w.kind) {
    case Q4_K: return k_groups<V, Q4_K>(w, x, rows, y, begin, end);
    case Q5_K: return k_groups<V, Q5_K>(w, x, rows, y, begin, end);
    case Q6_K: return k_groups<V, Q6_K>(w, x, rows, y, begin, end);
  }
}
