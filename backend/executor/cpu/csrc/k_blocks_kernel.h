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
// A split tile (Split: a 16-bit decode row as its high-byte and low-byte int8 rows, split_k_rows) joins each
// pair's block sums as 256 high + low in int32 before the float step: one convert and scale a block instead of
// two, and the pair's output written once.

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
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if constexpr (V::kBroadcastDot) {  // the activations broadcast by the dot product's own load
      typename V::I& high = K == Q6_K ? hi_dot[r] : lo_dot[r];
      lo_dot[r] = V::dot_bcast(lo_dot[r], lo, xq[r] + 4 * T);
      high = V::dot_bcast(high, hi, xq[r] + 16 + 4 * T);
    } else {
      const typename V::I xl = V::set1(four_bytes(xq[r] + 4 * T)), xh = V::set1(four_bytes(xq[r] + 16 + 4 * T));
      if constexpr (K == Q6_K) {
        lo_dot[r] = V::dot(lo_dot[r], lo, xl);
        hi_dot[r] = V::dot(hi_dot[r], hi, xh);
      } else {
        lo_dot[r] = V::dot2(lo_dot[r], lo, xl, hi, xh);
      }
    }
  }
}

// Row r's dot products and its sums of q per 16 values (half 0 or 1 of block k0 / 32), joined with row r + 1's,
// its low bytes, when split: |256 h + l| <= 32639 per value, so a block's sums stay below 2^26 (Q6_K's scaled
// halves below 2^31).
template <class V, bool Split>
K_TARGET inline typename V::I joined(const typename V::I* dots, int r) {
  if constexpr (Split) return V::add32(V::template slli32<8>(dots[r]), dots[r + 1]);
  return dots[r];
}

// Where a tile's row r keeps its data of block k0 / 32: KRows' row-major arrays, or (Packed) one tile's rows
// packed block by block (pack_tile), so that a block's R rows are one pointer and constant offsets apart: 8 row
// pointers and their strides spill x86's 16 general registers, and the spills and address arithmetic came to
// more instructions than the dot products. A packed tile also holds each row's per-block term ready for a
// broadcast load: Q4_K, Q5_K the minimum's dx * sum(q) (terms), Q6_K the offset -32 * sum(q) per half (sums),
// where its dot products start; each a convert, multiply and broadcast a row and block less in the loop.
template <int R, bool Packed, bool Split>
struct KRowsAt {
  const KRows& x;
  int64_t in;
  K_TARGET const int8_t* q(int r, int64_t k0) const { return x.q + (Packed ? (k0 / kSub * R + r) * kSub : r * in + k0); }
  K_TARGET float dx(int r, int64_t k0) const { return x.dx[Packed ? k0 / kSub * R + r : r * (in / kSub) + k0 / kSub]; }
  K_TARGET int32_t sum(int r, int64_t k0, int half) const {  // a split row's with its low bytes'
    if constexpr (Packed) return x.sums[(k0 / kSub * R + r) * 2 + half];
    const int32_t* sums = x.sums + r * (in / 16) + k0 / 16 + half;
    if constexpr (Split) return 256 * sums[0] + sums[in / 16];
    return sums[0];
  }
  K_TARGET float term(int r, int64_t k0) const {  // dx * sum(q) of the block (the step: a split row's low bytes')
    if constexpr (Packed) return x.terms[k0 / kSub * R + r];
    return dx(Split ? r + 1 : r, k0) * static_cast<float>(sum(r, k0, 0) + sum(r, k0, 1));
  }
  K_TARGET int32_t offset(int r, int64_t k0, int half) const {  // -32 sum(q) of a half (Q6_K)
    if constexpr (Packed) return x.sums[(k0 / kSub * R + r) * 2 + half];
    return -32 * sum(r, k0, half);
  }
};

// Rows r0 .. r0 + rows of x as one packed tile (KRowsAt), written at the same offsets of q, dx and sums (and
// terms, as dx).
template <KKind K>
K_TARGET inline void pack_tile(const KRows& x, int64_t in, int64_t r0, int64_t rows, int8_t* q, float* dx,
                               int32_t* sums, float* terms) {
  q += r0 * in, dx += r0 * (in / kSub), sums += r0 * (in / 16), terms += r0 * (in / kSub);
  for (int64_t b = 0; b < in / kSub; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = b * rows + r;
      const float step = x.dx[(r0 + r) * (in / kSub) + b];
      const int32_t* sum = x.sums + (r0 + r) * (in / 16) + 2 * b;
      __builtin_memcpy(q + i * kSub, x.q + (r0 + r) * in + b * kSub, kSub);
      dx[i] = step;
      if constexpr (K == Q6_K) {
        sums[2 * i] = -32 * sum[0];
        sums[2 * i + 1] = -32 * sum[1];
      } else {
        terms[i] = step * static_cast<float>(sum[0] + sum[1]);
      }
    }
}

// V::kGroups groups from g (`count` of them real: a second one past the matrix repeats the first, unstored)
// against R activation rows (Split: R / 2 16-bit rows, each its high then its low int8 row); y is the tile's
// first row of outputs; Packed: x is one packed tile (pack_tile).
template <class V, KKind K, int R, bool Split, bool Packed = false>
K_TARGET void k_tile(const KMatrix& w, int64_t g, int64_t count, const KRows& x, float* y) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kSuperBytes = super_bytes(K), kHeader = header_bytes(K), kBlockBytes = block_bytes(K);
  constexpr int kOut = Split ? R / 2 : R;  // output rows
  constexpr int kStride = Split ? 2 : 1;  // int8 rows an output row takes
  const int64_t in = w.in, supers = w.supers();
  const KRowsAt<R, Packed, Split> at{x, in};
  const uint8_t* base[2] = {w.super(g, 0), w.super(count > 1 ? g + 1 : g, 0)};
  F acc[kOut];
#pragma GCC unroll 16
  for (int o = 0; o < kOut; ++o) acc[o] = V::zero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* p[2] = {base[0] + s * kSuperBytes, base[1] + s * kSuperBytes};
    const F d = V::halves(p, 0);
    const F dmin = K == Q6_K ? V::zero_ps() : V::halves(p, 16);
    for (int64_t b = 0; b < 8; ++b) {
      const int64_t off = kHeader + b * kBlockBytes, k0 = s * kSuper + b * kSub;
      const int8_t* xq[R];
      I lo_dot[R], hi_dot[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        xq[r] = at.q(r, k0);
        if constexpr (K == Q6_K && V::kFloatQ6 && !Split) {  // the offset taken off from the start
          lo_dot[r] = V::set1(at.offset(r, k0, 0));
          hi_dot[r] = V::set1(at.offset(r, k0, 1));
        } else {
          lo_dot[r] = hi_dot[r] = V::zero_si();
        }
      }
      slice_dots<V, K, R, 0>(p, off, xq, lo_dot, hi_dot);
      slice_dots<V, K, R, 1>(p, off, xq, lo_dot, hi_dot);
      slice_dots<V, K, R, 2>(p, off, xq, lo_dot, hi_dot);
      slice_dots<V, K, R, 3>(p, off, xq, lo_dot, hi_dot);
      const int64_t scales = off + 128 + bits_bytes(K);
      if constexpr (K == Q6_K && V::kFloatQ6 && !Split) {
        // Each half's sum scaled in float (exact integers to 2^18, one rounding a product): four vpmulld a row
        // and block (two uops each, latency 3 on Zen 4) cost more than two converts and a multiply.
        const F dsl = V::mul(d, V::cvt(V::i8_to_i32(p, scales))), dsh = V::mul(d, V::cvt(V::i8_to_i32(p, scales + 8)));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const F both = V::fmadd(V::cvt(hi_dot[r]), dsh, V::mul(V::cvt(lo_dot[r]), dsl));
          acc[r] = V::fmadd(both, V::set1_ps(at.dx(r, k0)), acc[r]);
        }
      } else if constexpr (K == Q6_K) {
        const I sc_lo = V::i8_to_i32(p, scales), sc_hi = V::i8_to_i32(p, scales + 8);
#pragma GCC unroll 16
        for (int o = 0; o < kOut; ++o) {
          const int r = kStride * o, step = r + kStride - 1;  // a split row's step is its low bytes'
          const F dd = V::mul(d, V::set1_ps(at.dx(step, k0)));
          if constexpr (Split) {
            // Each half scaled apart: both at their extremes the sum of the two would pass int32.
            const I lo = V::sub32(joined<V, true>(lo_dot, r), V::set1(32 * at.sum(r, k0, 0)));
            const I hi = V::sub32(joined<V, true>(hi_dot, r), V::set1(32 * at.sum(r, k0, 1)));
            const F both = V::add_ps(V::cvt(V::mullo32(lo, sc_lo)), V::cvt(V::mullo32(hi, sc_hi)));
            acc[o] = V::fmadd(both, dd, acc[o]);
          } else {
            const I offset = V::add32(V::mullo32(sc_lo, V::set1(at.sum(r, k0, 0))),
                                      V::mullo32(sc_hi, V::set1(at.sum(r, k0, 1))));
            const I dot = V::sub32(V::add32(V::mullo32(lo_dot[r], sc_lo), V::mullo32(hi_dot[r], sc_hi)),
                                   V::template slli32<5>(offset));
            acc[o] = V::fmadd(V::cvt(dot), dd, acc[o]);
          }
        }
      } else {
        const F ds = V::mul(d, V::u8_to_ps(p, scales)), ms = V::mul(dmin, V::u8_to_ps(p, scales + 8));
#pragma GCC unroll 16
        for (int o = 0; o < kOut; ++o) {
          const int r = kStride * o, step = r + kStride - 1;
          const float dx = at.dx(step, k0);
          acc[o] = V::fmadd(V::cvt(joined<V, Split>(lo_dot, r)), V::mul(ds, V::set1_ps(dx)), acc[o]);
          acc[o] = V::fnmadd(ms, V::set1_ps(at.term(r, k0)), acc[o]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int o = 0; o < kOut; ++o) V::store(acc[o], y + o * w.out, g, count, w.out);
}

using KTile = void (*)(const KMatrix&, int64_t, int64_t, const KRows&, float*);

template <class V, KKind K, bool Packed, int... R>
constexpr std::array<KTile, sizeof...(R) + 1> k_tiles(std::integer_sequence<int, R...>) {
  return {nullptr, k_tile<V, K, R + 1, false, Packed>...};
}

// Tiles of at most `most` units from u0 of `units`, even: 5 rows run as 3 and 2.
constexpr int64_t next_tile(int64_t units, int64_t u0, int64_t most) {
  const int64_t left = units - u0, passes = (left + most - 1) / most;
  return (left + passes - 1) / passes;
}

constexpr int kSplitTileRows = 4;  // int8 rows of a split tile (2 decode rows): decode runs on 16-register paths

// `rows` int8 activation rows (split: rows / 2 16-bit ones, a pair each) in tiles of at most V::tile_rows(K).
template <class V, KKind K>
K_TARGET void k_groups(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin,
                       int64_t end) {
  constexpr auto tiles = k_tiles<V, K, false>(std::make_integer_sequence<int, V::tile_rows(K)>());
  constexpr auto packed_tiles = k_tiles<V, K, true>(std::make_integer_sequence<int, V::tile_rows(K)>());
  constexpr KTile split_tiles[kSplitTileRows / 2 + 1] = {nullptr, k_tile<V, K, 2, true>, k_tile<V, K, 4, true>};
  const int64_t in = w.in, stride = split ? 2 : 1, units = rows / stride;
  const int64_t most = split ? kSplitTileRows / 2 : V::tile_rows(K);
  const bool pack = V::kPackTiles && !split;
  KRows src = x;
  if (pack) {  // a copy of the chunk's activations, small beside the products of all the groups over them
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> dx;
    thread_local std::vector<int32_t> sums;
    thread_local std::vector<float> terms;
    q.resize(rows * in);
    dx.resize(rows * (in / kSub));
    sums.resize(rows * (in / 16));
    terms.resize(rows * (in / kSub));
    for (int64_t u0 = 0, tile = 0; u0 < units; u0 += tile) {
      tile = next_tile(units, u0, most);
      pack_tile<K>(x, in, u0, tile, q.data(), dx.data(), sums.data(), terms.data());
    }
    src = KRows{q.data(), dx.data(), sums.data(), terms.data()};
  }
  for (int64_t g = begin; g < end; g += V::kGroups) {
    const int64_t count = end - g < V::kGroups ? end - g : V::kGroups;
    for (int64_t u0 = 0, tile = 0; u0 < units; u0 += tile) {
      tile = next_tile(units, u0, most);
      const int64_t r0 = u0 * stride;
      const KRows part{src.q + r0 * in, src.dx + r0 * (in / kSub), src.sums + r0 * (in / 16),
                       pack ? src.terms + r0 * (in / kSub) : nullptr};
      const KTile run = split ? split_tiles[tile] : (pack ? packed_tiles : tiles)[tile];
      run(w, g, count, part, y + u0 * w.out);
    }
  }
}

template <class V>
K_TARGET void k_rows(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin,
                     int64_t end) {
  switch (w.kind) {
    case Q4_K: return k_groups<V, Q4_K>(w, x, rows, split, y, begin, end);
    case Q5_K: return k_groups<V, Q5_K>(w, x, rows, split, y, begin, end);
    case Q6_K: return k_groups<V, Q6_K>(w, x, rows, split, y, begin, end);
  }
}
