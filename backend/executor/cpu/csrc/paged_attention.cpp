// Decode attention over the paged KV cache, read in place: no gather of a sequence's blocks into a buffer.
//
// For each sequence (a few query tokens at the end of its context: one for a decode, 1 + k when k draft
// tokens are verified), its queries walk the sequence's blocks through its block table and keep an online
// softmax (running maximum, running sum and the weighted sum of values, all float32); each KV head serves its
// group of query heads (GQA). The cache is [blocks, block_size, kv_heads, head_dim], float32, float16 or
// bfloat16 (the engine's KV cache dtype; 16 bits halve its memory and the bytes each decode step reads); values are
// widened to float32 as they are loaded, and everything else stays float32. A work item is a sequence's range of blocks, all heads at once, so that it reads each block
// as one contiguous run (per KV head, its rows of a block are strided), and prefetches the next block, since a
// scattered block table defeats the hardware prefetcher. A sequence is split into ranges only when there are
// too few sequences to keep every thread busy; the ranges' softmax states are then merged.
// An AVX2+FMA path is chosen at run time for head_dim a multiple of 8; a scalar path runs elsewhere. Nothing
// needs AVX-512.
//
// write_kv puts a step's new keys and values into the same cache, one call for both (torch takes two
// index_copy_ calls and views), rounding them to the cache's dtype (to nearest, as torch's .to() does).
//
// Registered as torch.ops.tidegate.paged_attention and .write_kv, because the extension's Python module is
// block_matmul.cpp's.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model_ops.h"
#include "vector_math.h"

namespace {

using namespace tidegate_simd;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMinSplitBlocks = 4;  // a split range shorter than this costs more to merge than it saves
// Multiply-adds below which a second thread costs more than it gains. One sequence of 300 tokens (173k) gains:
// its decode step took 0.96x the time with the key ranges split over two threads, two sequences 0.92x, with
// spinning and with sleeping OpenMP workers alike (measured, 2-core AVX2; docs/benchmarks.md).
constexpr int64_t kSerialWork = 1 << 16;

template <typename T>
struct Cache {
  const T* keys;
  const T* values;
  int64_t num_blocks, block_size, kv_heads, dim;
  int64_t row() const { return kv_heads * dim; }  // elements between consecutive tokens of one block
};

struct Query {
  const float* q;  // [T, heads, dim], any token and head strides (q is often a view of the fused q|k rows)
  float* out;  // [T, heads, dim], contiguous
  int64_t heads, group, token_stride, head_stride;
  const float* at(int64_t token, int64_t head) const { return q + token * token_stride + head * head_stride; }
};

// One sequence's slice of the step, as the work items see it.
struct Sequence {
  int64_t start, q_len, context;
  const int32_t* table;
};

struct Item {
  int64_t seq, first_block, end_block;
  int64_t state;  // offset of its softmax state in the scratch: per query, maximums, then sums, then weighted values
};

// Keys of query row j (of q_len) are visible up to this many positions: causal over the verified drafts.
inline int64_t visible(const Sequence& s, int64_t j) { return s.context - s.q_len + j + 1; }

template <typename T>
void scores_scalar(const float* q, const T* keys, int64_t row, int64_t n, int64_t dim, float scale, float* s) {
  for (int64_t t = 0; t < n; ++t) {
    const T* k = keys + t * row;
    float dot = 0.0f;
    for (int64_t c = 0; c < dim; ++c) dot += q[c] * static_cast<float>(k[c]);
    s[t] = dot * scale;
  }
}

void exp_scalar(float* p, int64_t n, float max) {
  for (int64_t t = 0; t < n; ++t) p[t] = std::exp(p[t] - max);
}

template <typename T>
void accumulate_scalar(float* acc, float correction, const float* p, const T* values, int64_t row, int64_t n,
                       int64_t dim) {
  for (int64_t c = 0; c < dim; ++c) acc[c] *= correction;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < dim; ++c) acc[c] += p[t] * static_cast<float>(values[t * row + c]);
}

#if defined(__x86_64__)
// Eight cache values widened to float32: F16C for float16, a 16-bit shift for bfloat16 (its upper half).
AVX2_TARGET inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
AVX2_TARGET inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
AVX2_TARGET inline __m256 load8(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <typename T>
AVX2_TARGET void scores_avx2(const float* q, const T* keys, int64_t row, int64_t n, int64_t dim, float scale,
                             float* s) {
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {  // eight keys at once: eight independent FMA chains, each query vector loaded once
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    const T* k = keys + t * row;
    for (int64_t c = 0; c < dim; c += 8) {
      const __m256 qc = _mm256_loadu_ps(q + c);
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qc, load8(k + i * row + c), a[i]);
    }
    // Horizontal sums of the eight at once: within each 128-bit lane, then the two lanes added.
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    _mm256_storeu_ps(s + t, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
  }
  for (; t < n; ++t) {
    __m256 a = _mm256_setzero_ps();
    const T* k = keys + t * row;
    for (int64_t c = 0; c < dim; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load8(k + c), a);
    s[t] = hsum(a) * scale;
  }
}

AVX2_TARGET void exp_avx2(float* p, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) _mm256_storeu_ps(p + t, exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + t), m)));
  for (; t < n; ++t) p[t] = std::exp(p[t] - max);
}

// C vectors (8C floats) of the accumulator held in registers over all n keys: C independent FMA chains.
template <int C, typename T>
AVX2_TARGET void accumulate_columns_avx2(float* acc, __m256 correction, const float* p, const T* values,
                                         int64_t row, int64_t n) {
  __m256 a[C];
  for (int c = 0; c < C; ++c) a[c] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * c), correction);
  for (int64_t t = 0; t < n; ++t) {
    const __m256 pt = _mm256_set1_ps(p[t]);
    for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(pt, load8(values + t * row + 8 * c), a[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

template <typename T>
AVX2_TARGET void accumulate_avx2(float* acc, float correction, const float* p, const T* values, int64_t row,
                                 int64_t n, int64_t dim) {
  const __m256 corr = _mm256_set1_ps(correction);
  int64_t c = 0;
  for (; c + 64 <= dim; c += 64) accumulate_columns_avx2<8>(acc + c, corr, p, values + c, row, n);
  for (; c + 32 <= dim; c += 32) accumulate_columns_avx2<4>(acc + c, corr, p, values + c, row, n);
  for (; c < dim; c += 8) accumulate_columns_avx2<1>(acc + c, corr, p, values + c, row, n);
}
#endif

template <typename T>
void prefetch(const T* from, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(from);
  for (int64_t i = 0; i < count * static_cast<int64_t>(sizeof(T)); i += 64) __builtin_prefetch(bytes + i);
}

// The queries of one item (q_len rows x heads, query i = row * heads + head) against its range of blocks.
template <typename T>
void attend_item(const Cache<T>& cache, const Query& query, const Sequence& s, const Item& item, float scale, bool avx2,
                 float* state, std::vector<float>& p) {
  const int64_t dim = cache.dim, row = cache.row(), bs = cache.block_size, queries = s.q_len * query.heads;
  float* maxima = state;
  float* sums = state + queries;
  std::fill(maxima, maxima + queries, kNegInf);
  std::fill(sums, sums + queries * (dim + 1), 0.0f);
  for (int64_t b = item.first_block; b < item.end_block; ++b) {
    // Each head prefetches its share of the next block: all of it at once measured slower (fill buffers run out).
    const int64_t next = b + 1 < item.end_block ? s.table[b + 1] * bs * row : -1;
    const int64_t share = (bs * row / query.heads + 15) / 16 * 16;
    for (int64_t head = 0; head < query.heads; ++head) {
      const int64_t from = head * share, count = std::min(share, bs * row - from);
      if (next >= 0 && count > 0) {
        prefetch(cache.keys + next + from, count);
        prefetch(cache.values + next + from, count);
      }
      const int64_t offset = (s.table[b] * bs * cache.kv_heads + head / query.group) * dim;
      const T* keys = cache.keys + offset;
      const T* values = cache.values + offset;
      for (int64_t j = 0; j < s.q_len; ++j) {
        const int64_t n = std::min(bs, visible(s, j) - b * bs);
        if (n <= 0) continue;  // this row's causal limit ends before the block
        const int64_t qi = j * query.heads + head;
        const float* q = query.at(s.start + j, head);
#if defined(__x86_64__)
        if (avx2) scores_avx2(q, keys, row, n, dim, scale, p.data());
        else
#endif
          scores_scalar(q, keys, row, n, dim, scale, p.data());
        const float block_max = *std::max_element(p.begin(), p.begin() + n);
        const float max = std::max(maxima[qi], block_max);
        const float correction = maxima[qi] == kNegInf ? 0.0f : std::exp(maxima[qi] - max);
        float* acc = state + 2 * queries + qi * dim;
#if defined(__x86_64__)
        if (avx2) {
          exp_avx2(p.data(), n, max);
          accumulate_avx2(acc, correction, p.data(), values, row, n, dim);
        } else
#endif
        {
          exp_scalar(p.data(), n, max);
          accumulate_scalar(acc, correction, p.data(), values, row, n, dim);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n; ++t) sum += p[t];
        sums[qi] = sums[qi] * correction + sum;
        maxima[qi] = max;
      }
    }
  }
}

// Merges the softmax states of one sequence's ranges, items [first, end) (often just one), into the output.
void merge(const Query& query, const Sequence& s, const std::vector<Item>& items, int64_t first, int64_t end,
           int64_t dim, const float* scratch) {
  const int64_t queries = s.q_len * query.heads;
  std::vector<float> acc(dim);
  for (int64_t qi = 0; qi < queries; ++qi) {
    float max = kNegInf;
    for (int64_t i = first; i < end; ++i) max = std::max(max, scratch[items[i].state + qi]);
    float sum = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = first; i < end; ++i) {
      const float* part = scratch + items[i].state;
      if (part[qi] == kNegInf) continue;  // the range lies wholly past this row's causal limit
      const float weight = std::exp(part[qi] - max);
      sum += part[queries + qi] * weight;
      for (int64_t c = 0; c < dim; ++c) acc[c] += part[2 * queries + qi * dim + c] * weight;
    }
    float* out = query.out + (s.start * query.heads + qi) * dim;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t c = 0; c < dim; ++c) out[c] = acc[c] * inv;
  }
}

void check_index(const torch::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.dtype() == torch::kInt32 && t.dim() == dims && t.is_contiguous() && t.device().is_cpu(), name,
              ": contiguous int32 on the CPU with ", dims, " dimension(s)");
}

void check_cache(const torch::Tensor& k_cache, const torch::Tensor& v_cache) {
  const auto type = k_cache.scalar_type();
  TORCH_CHECK((type == torch::kFloat32 || type == torch::kFloat16 || type == torch::kBFloat16) &&
                  v_cache.scalar_type() == type && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "caches: float32, float16 or bfloat16 (both the same) on the CPU");
}

// out[starts[i] : starts[i] + q_lens[i]] = causal attention of those rows of q over sequence i's context.
template <typename T>
void paged_attention_as(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                        const torch::Tensor& out, const torch::Tensor& starts, const torch::Tensor& q_lens,
                        const torch::Tensor& context_lens, const torch::Tensor& block_tables, double scale) {
  for (const torch::Tensor* t : {&q, &out})
    TORCH_CHECK(t->dtype() == torch::kFloat32 && t->device().is_cpu(), "q and out: float32 on the CPU");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && out.is_contiguous() && q.stride(2) == 1,
              "caches and out contiguous, q's head_dim contiguous");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "q and out [T, heads, dim], caches [blocks, block_size, kv_heads, dim]");
  check_index(starts, "starts", 1);
  check_index(q_lens, "q_lens", 1);
  check_index(context_lens, "context_lens", 1);
  check_index(block_tables, "block_tables", 2);
  const Cache<T> cache{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_cache.size(0), k_cache.size(1),
                       k_cache.size(2), k_cache.size(3)};
  const int64_t heads = q.size(1), tokens = q.size(0), dim = cache.dim, num_seqs = starts.size(0);
  TORCH_CHECK(q.size(2) == dim, "head_dim must match the cache");
  TORCH_CHECK(heads % cache.kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q_lens.size(0) == num_seqs && context_lens.size(0) == num_seqs && block_tables.size(0) == num_seqs,
              "one start, q_len, context length and block table row per sequence");
  const Query query{q.data_ptr<float>(), out.data_ptr<float>(), heads, heads / cache.kv_heads, q.stride(0), q.stride(1)};
  const int32_t* table = block_tables.data_ptr<int32_t>();
  std::vector<Sequence> seqs(num_seqs);
  int64_t work = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const Sequence s{starts.data_ptr<int32_t>()[i], q_lens.data_ptr<int32_t>()[i],
                     context_lens.data_ptr<int32_t>()[i], table + i * block_tables.size(1)};
    const int64_t blocks = (s.context + cache.block_size - 1) / cache.block_size;
    TORCH_CHECK(s.q_len >= 1 && s.start >= 0 && s.start + s.q_len <= tokens && s.q_len <= s.context,
                "sequence ", i, ": its rows must lie in q and within its context");
    TORCH_CHECK(blocks <= block_tables.size(1), "sequence ", i, ": its context needs more blocks than its table has");
    for (int64_t b = 0; b < blocks; ++b)
      TORCH_CHECK(s.table[b] >= 0 && s.table[b] < cache.num_blocks, "sequence ", i, ": block id out of range");
    seqs[i] = s;
    work += s.context * s.q_len * heads * dim;
  }
  const int64_t threads = work < kSerialWork ? 1 : at::get_num_threads();
  // Split each sequence into as many block ranges as it takes to give every thread a couple of items.
  const int64_t wanted = num_seqs >= 2 * threads ? 1 : (2 * threads + num_seqs - 1) / num_seqs;
  std::vector<Item> items;
  std::vector<int64_t> first_item(num_seqs + 1);
  int64_t scratch_size = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t blocks = (seqs[i].context + cache.block_size - 1) / cache.block_size;
    const int64_t splits = std::max<int64_t>(1, std::min(wanted, blocks / kMinSplitBlocks));
    first_item[i] = static_cast<int64_t>(items.size());
    for (int64_t part = 0; part < splits; ++part) {
      items.push_back({i, blocks * part / splits, blocks * (part + 1) / splits, scratch_size});
      scratch_size += seqs[i].q_len * heads * (dim + 2);
    }
  }
  first_item[num_seqs] = static_cast<int64_t>(items.size());
  std::vector<float> scratch(scratch_size);
  const float fscale = static_cast<float>(scale);
  const bool avx2 = use_avx2() && dim % 8 == 0;  // other head sizes (none in the Llama family) take the portable path
  const int64_t count = static_cast<int64_t>(items.size());
  at::parallel_for(0, count, threads == 1 ? count : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(cache.block_size);
    for (int64_t i = begin; i < end; ++i) {
      attend_item(cache, query, seqs[items[i].seq], items[i], fscale, avx2, scratch.data() + items[i].state, p);
    }
  });
  for (int64_t i = 0; i < num_seqs; ++i) merge(query, seqs[i], items, first_item[i], first_item[i + 1], dim, scratch.data());
}

void paged_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                     const torch::Tensor& out, const torch::Tensor& starts, const torch::Tensor& q_lens,
                     const torch::Tensor& context_lens, const torch::Tensor& block_tables, double scale) {
  check_cache(k_cache, v_cache);
  switch (k_cache.scalar_type()) {
    case torch::kFloat16:
      return paged_attention_as<c10::Half>(q, k_cache, v_cache, out, starts, q_lens, context_lens, block_tables, scale);
    case torch::kBFloat16:
      return paged_attention_as<c10::BFloat16>(q, k_cache, v_cache, out, starts, q_lens, context_lens, block_tables,
                                               scale);
    default:
      return paged_attention_as<float>(q, k_cache, v_cache, out, starts, q_lens, context_lens, block_tables, scale);
  }
}

// n floats rounded to the cache's type: F16C's conversion for float16 (to nearest even, as c10::Half's own).
template <typename T>
void store(const float* from, T* to, int64_t n, bool avx2);

template <>
void store(const float* from, float* to, int64_t n, bool) { std::copy_n(from, n, to); }

#if defined(__x86_64__)
AVX2_TARGET void store_half_avx2(const float* from, c10::Half* to, int64_t n) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(from + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + c), half);
  }
  for (; c < n; ++c) to[c] = c10::Half(from[c]);
}
#endif

template <>
void store(const float* from, c10::Half* to, int64_t n, bool avx2) {
#if defined(__x86_64__)
  if (avx2) return store_half_avx2(from, to, n);
#endif
  for (int64_t c = 0; c < n; ++c) to[c] = c10::Half(from[c]);
}

template <>
void store(const float* from, c10::BFloat16* to, int64_t n, bool) {
  for (int64_t c = 0; c < n; ++c) to[c] = c10::BFloat16(from[c]);
}

template <typename T>
void write_rows(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& k_cache,
                const torch::Tensor& v_cache, const int64_t* slot) {
  const int64_t rows = k.size(0), heads = k.size(1), dim = k.size(2);
  const float* ks = k.data_ptr<float>();
  const float* vs = v.data_ptr<float>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  const bool avx2 = use_avx2();
  for (int64_t t = 0; t < rows; ++t) {
    if (slot[t] < 0) continue;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t to = (slot[t] * heads + h) * dim;
      store(ks + t * k.stride(0) + h * k.stride(1), kc + to, dim, avx2);
      store(vs + t * v.stride(0) + h * v.stride(1), vc + to, dim, avx2);
    }
  }
}

// k, v [T, kv_heads, dim] (any token and head strides, dim contiguous) into the caches at slots[t], that is
// block * block_size + offset; a slot of -1 (a padded row) is not written.
void write_kv(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& k_cache,
              const torch::Tensor& v_cache, const torch::Tensor& slots) {
  for (const torch::Tensor* t : {&k, &v})
    TORCH_CHECK(t->dtype() == torch::kFloat32 && t->device().is_cpu(), "k and v: float32 on the CPU");
  check_cache(k_cache, v_cache);
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(), "caches: contiguous [blocks, block_size, kv_heads, dim]");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3) &&
                  k.stride(2) == 1 && v.stride(2) == 1, "k and v: [T, kv_heads, dim] as the cache's, dim contiguous");
  TORCH_CHECK(slots.dtype() == torch::kInt64 && slots.dim() == 1 && slots.is_contiguous() && slots.device().is_cpu() &&
                  slots.size(0) == k.size(0), "slots: contiguous int64 on the CPU, one per row");
  const int64_t rows = k.size(0), capacity = k_cache.size(0) * k_cache.size(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < rows; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < capacity, "slot ", slot[t], " outside the cache's ", capacity);
  switch (k_cache.scalar_type()) {
    case torch::kFloat16: return write_rows<c10::Half>(k, v, k_cache, v_cache, slot);
    case torch::kBFloat16: return write_rows<c10::BFloat16>(k, v, k_cache, v_cache, slot);
    default: return write_rows<float>(k, v, k_cache, v_cache, slot);
  }
}

}  // namespace

void tidegate_ops::paged_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                   const torch::Tensor& out, const torch::Tensor& starts, const torch::Tensor& q_lens,
                                   const torch::Tensor& context_lens, const torch::Tensor& block_tables, double scale) {
  ::paged_attention(q, k_cache, v_cache, out, starts, q_lens, context_lens, block_tables, scale);
}
void tidegate_ops::write_kv(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& k_cache,
                            const torch::Tensor& v_cache, const torch::Tensor& slots) {
  ::write_kv(k, v, k_cache, v_cache, slots);
}

TORCH_LIBRARY(tidegate, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor starts, Tensor q_lens, "
        "Tensor context_lens, Tensor block_tables, float scale) -> ()", &paged_attention);
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots) -> ()", &write_kv);
}
