// GGML's K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 values each) as k_quants.py repacks them, and the integer
// products on them (k_blocks.cpp: portable and AVX2 paths, k_blocks_avx512.cpp: AVX-512, VNNI where present).
//
// The repacked matrix keeps the file's values exactly: every quant, every 6- or 8-bit sub-block scale and minimum,
// every float16 super-block scale. Output rows are interleaved 8 at a time (a group), and within a group the data
// of each super-block follows its float16 header, one 32-value block after another:
//   header: d [8 rows] float16, then (Q4_K, Q5_K) dmin [8 rows] float16
//   a block: nibbles [4][32 bytes]; byte 4 r + j of vector t holds row r's value 4 t + j in its low nibble and
//            value 16 + 4 t + j in its high one (the low 4 bits of each)
//            Q5_K: bits [32 bytes]; byte 4 r + j: bit t is bit 4 of value 4 t + j, bit 4 + t that of 16 + 4 t + j
//            Q6_K: bits [2][32 bytes]; byte 4 r + j of the first (second): bits 2 t, 2 t + 1 are bits 4, 5 of
//            value 4 t + j (16 + 4 t + j)
//            Q4_K, Q5_K: scale [8 rows] uint8, minimum [8 rows] uint8 (6-bit): w = d * scale * q - dmin * minimum
//            Q6_K: scale of values 0-15 [8 rows] int8, of values 16-31 [8 rows] int8: w = d * scale * (q - 32)
// A 32-byte vector of nibbles is thus 4 consecutive values of each of the 8 rows: one u8 x s8 dot product against
// 4 activations broadcast (maddubs, or VNNI's dpbusd) forms each row's sum in its own int32 lane.
#pragma once

#include <cstdint>

namespace tidegate_k {

enum KKind : int64_t { Q4_K = 3, Q5_K = 4, Q6_K = 5 };  // after block_format.h's Q4_0, Q4_1, Q8_0
constexpr int64_t kSuper = 256;  // values of a super-block
constexpr int64_t kSub = 32;  // values of a block: one activation scale, one (Q6_K: two) weight scales
constexpr int64_t kRowsPerGroup = 8;
constexpr int64_t kWideRows = 16;  // activation rows (int8 halves included) up to which AVX-512 takes one group a vector

constexpr bool is_k_kind(int64_t kind) { return kind >= Q4_K && kind <= Q6_K; }
constexpr int64_t header_bytes(KKind k) { return k == Q6_K ? 16 : 32; }
constexpr int64_t bits_bytes(KKind k) { return k == Q4_K ? 0 : (k == Q5_K ? 32 : 64); }
constexpr int64_t block_bytes(KKind k) { return 128 + bits_bytes(k) + 16; }
constexpr int64_t super_bytes(KKind k) { return header_bytes(k) + 8 * block_bytes(k); }  // of a group

struct KMatrix {
  const uint8_t* data;  // [groups][supers][super_bytes]
  int64_t in, out;
  KKind kind;

  int64_t supers() const { return in / kSuper; }
  int64_t groups() const { return (out + kRowsPerGroup - 1) / kRowsPerGroup; }
  const uint8_t* super(int64_t g, int64_t s) const { return data + (g * supers() + s) * super_bytes(kind); }
};

// Activation rows quantized per 32 values to int8 (round(x / dx) with dx = max|x| / 127, to nearest even): q
// [rows, in], dx [rows, in / 32], and the sums of q per 16 values [rows, in / 16] (the minimum and offset terms).
struct KRows {
  const int8_t* q;
  const float* dx;
  const int32_t* sums;
  const float* terms = nullptr;  // a packed tile's only (k_blocks_kernel.h, pack_tile)
};

void quantize_k_rows(const float* x, int64_t rows, int64_t in, int8_t* q, float* dx, int32_t* sums);
// Each row quantized to 16 bits per 32 values (v = round(x / s), s = max|x| / 32639) and written as two int8 rows,
// its high bytes h = floor((v + 128) / 256) with step 256 s and its low bytes v - 256 h with step s (2 rows each).
void split_k_rows(const float* x, int64_t rows, int64_t in, int8_t* q, float* dx, int32_t* sums);

// y [rows, out] (rows w.out apart; split: [rows / 2, out], each pair of rows one 16-bit row as split_k_rows
// writes it) for the output groups [begin, end): the portable path, and the vector ones.
void k_rows_scalar(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin, int64_t end);
void k_rows_avx2(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin, int64_t end);
void k_rows_avx512(const KMatrix& w, const KRows& x, int64_t rows, bool split, float* y, int64_t begin, int64_t end);
bool cpu_has_avx512();  // AVX-512 F, BW, VL (k_blocks_avx512.cpp); VNNI is used where present too
bool cpu_has_vnni();

// The 32 values of block b (0 .. in / 32) of output row o, exactly as the file defines them.
void dequantize_k_block(const KMatrix& w, int64_t o, int64_t b, float* out);

}  // namespace tidegate_k
