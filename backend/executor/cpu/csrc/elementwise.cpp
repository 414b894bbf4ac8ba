// The row-wise ops around a decoder layer's matrix products, for float32 rows on the CPU: each is one C++
// call where torch runs several small ops (F.rms_norm alone is about nine), and a decode step's rows are so
// small that those calls' overhead, not their arithmetic, is what they cost.
//
// - rms_norm: weight * x / sqrt(mean(x^2) + eps) per row, rounded as transformers' LlamaRMSNorm rounds
//   (x * inv_rms first, then the weight). The sum of squares is accumulated in double, so that its order
//   (not torch's) leaves the mean correctly rounded; the result is within 4e-7 (relative) of torch's.
// - add_rms_norm: residual += x in place, then the norm of the new residual, in one pass per row (the row
//   stays in L1 between its two reads).
// - silu_and_mul: silu(gate) * up from the rows of the merged gate|up product, computed as torch computes
//   silu (g / (1 + exp(-g))) up to its exp: within a few ulp.
// - rotate_: Hugging Face's rotate_half rotary embedding of q and k heads in place, from the cos|sin table
//   row of each token's position: the same products and sums as the torch reference, so the same bits.
// Rows are split over torch's threads only when there are many (prefill): a decode step's call takes a few
// microseconds, less than waking a worker. An AVX2+FMA path is chosen at run time; a scalar path runs
// elsewhere and for tests. Nothing needs AVX-512.
//
// Registered as torch.ops.tidegate.*, a fragment of the library paged_attention.cpp defines.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model_ops.h"
#include "vector_math.h"

namespace {

using namespace tidegate_simd;

constexpr int64_t kSerialFloats = 1 << 16;  // a call on fewer floats runs on the calling thread

float inv_rms(double sum_squares, int64_t n, float eps) {
  const float mean = static_cast<float>(sum_squares) / static_cast<float>(n);
  return 1.0f / std::sqrt(mean + eps);
}

// out = norm(h) where h is x, or (with a residual) the residual after residual += x.
void norm_row_scalar(const float* x, float* residual, const float* weight, float* out, int64_t n, float eps) {
  const float* h = x;
  if (residual != nullptr) {
    for (int64_t i = 0; i < n; ++i) residual[i] += x[i];
    h = residual;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += h[i] * h[i];  // each square rounded to float, as torch's pow is
  const float inv = inv_rms(sum, n, eps);
  for (int64_t i = 0; i < n; ++i) out[i] = h[i] * inv * weight[i];
}

#if defined(__x86_64__)
AVX2_TARGET inline void add_squares(__m256 v, __m256d& low, __m256d& high) {
  const __m256 squares = _mm256_mul_ps(v, v);
  low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(squares)));
  high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(squares, 1)));
}

AVX2_TARGET void norm_row_avx2(const float* x, float* residual, const float* weight, float* out, int64_t n,
                               float eps) {
  const float* h = residual != nullptr ? residual : x;
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (residual != nullptr) {
      v = _mm256_add_ps(_mm256_loadu_ps(residual + i), v);
      _mm256_storeu_ps(residual + i, v);
    }
    add_squares(v, low, high);
  }
  const __m256d both = _mm256_add_pd(low, high);
  const __m128d pair = _mm_add_pd(_mm256_castpd256_pd128(both), _mm256_extractf128_pd(both, 1));
  double sum = _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)));
  for (; i < n; ++i) {
    if (residual != nullptr) residual[i] += x[i];
    sum += h[i] * h[i];
  }
  const float inv = inv_rms(sum, n, eps);
  const __m256 scale = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(h + i), scale);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(normed, _mm256_loadu_ps(weight + i)));
  }
  for (; i < n; ++i) out[i] = h[i] * inv * weight[i];
}
#endif

inline float silu_scalar(float g) { return g / (1.0f + std::exp(-g)); }

void silu_mul_row_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu_scalar(gate[i]) * up[i];
}

// The compiler may fuse a product and the sum after it into one FMA, which rounds once where the torch
// reference rounds twice; passing the product through an empty asm statement keeps the two roundings.
inline float unfused(float v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#else
  asm("" : "+m"(v));
#endif
  return v;
}

// x1 * cos - x2 * sin | x2 * cos + x1 * sin over the two halves of one head, rounded as the reference rounds
// (its x2 * -sin added equals x2 * sin subtracted, bit for bit).
void rotate_head_scalar(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    x[i] = unfused(x1 * cos[i]) - unfused(x2 * sin[i]);
    x[half + i] = unfused(x2 * cos[i]) + unfused(x1 * sin[i]);
  }
}

#if defined(__x86_64__)
// For g < 0, g / (1 + exp(-g)) is computed as g * e / (1 + e) with e = exp(g): the polynomial serves x <= 0 only.
AVX2_TARGET void silu_mul_row_avx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_nonpositive_avx2(_mm256_or_ps(g, sign));  // exp(-|g|)
    const __m256 numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), _mm256_cmp_ps(g, zero, _CMP_LT_OQ));
    const __m256 silu = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  silu_mul_row_scalar(gate + i, up + i, out + i, n - i);
}

AVX2_TARGET inline __m256 unfused(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

AVX2_TARGET void rotate_head_avx2(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; i += 8) {
    const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
    const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
    _mm256_storeu_ps(x + i, _mm256_sub_ps(unfused(_mm256_mul_ps(x1, c)), unfused(_mm256_mul_ps(x2, s))));
    _mm256_storeu_ps(x + half + i, _mm256_add_ps(unfused(_mm256_mul_ps(x2, c)), unfused(_mm256_mul_ps(x1, s))));
  }
}
#endif

int64_t grain_rows(int64_t floats_per_row) {
  return std::max<int64_t>(1, kSerialFloats / std::max<int64_t>(floats_per_row, 1));
}

void check_float(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dtype() == torch::kFloat32 && t.device().is_cpu() && t.dim() >= 1, name,
              ": float32 on the CPU, with at least one dimension");
}

// The norm of each row of x (after residual += x, where a residual is given) into a new tensor.
torch::Tensor norm_rows(const torch::Tensor& x, float* residual, const torch::Tensor& weight, double eps) {
  const int64_t n = weight.numel(), rows = n > 0 ? x.numel() / n : 0;
  torch::Tensor out = torch::empty_like(x);
  const float* xs = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  const bool avx2 = use_avx2();
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* res = residual != nullptr ? residual + r * n : nullptr;
#if defined(__x86_64__)
      if (avx2) {
        norm_row_avx2(xs + r * n, res, w, o + r * n, n, e);
        continue;
      }
#endif
      norm_row_scalar(xs + r * n, res, w, o + r * n, n, e);
    }
  });
  return out;
}

void check_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_float(x, "x");
  check_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && x.size(-1) == weight.size(0),
              "weight: contiguous [hidden], hidden the last size of x");
  TORCH_CHECK(eps >= 0.0, "eps must not be negative");
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_norm(x, weight, eps);
  return norm_rows(x.contiguous(), nullptr, weight, eps);
}

torch::Tensor add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                           double eps) {
  check_norm(x, weight, eps);
  check_float(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.is_contiguous(),
              "residual: contiguous (it is updated in place), of x's shape");
  TORCH_CHECK(!residual.is_same(x), "residual must not be x");
  return norm_rows(x.contiguous(), residual.data_ptr<float>(), weight, eps);
}

// silu(gate) * up for gate_up [..., 2n] holding gate then up: [..., n].
torch::Tensor silu_and_mul(const torch::Tensor& gate_up) {
  check_float(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "gate_up: an even last size (gate then up)");
  const torch::Tensor rows_in = gate_up.contiguous();
  const int64_t n = gate_up.size(-1) / 2, rows = n > 0 ? gate_up.numel() / (2 * n) : 0;
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() = n;
  torch::Tensor out = torch::empty(shape, gate_up.options());
  const float* in = rows_in.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const bool avx2 = use_avx2();
  at::parallel_for(0, rows, grain_rows(2 * n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
#if defined(__x86_64__)
      if (avx2) {
        silu_mul_row_avx2(in + 2 * r * n, in + (2 * r + 1) * n, o + r * n, n);
        continue;
      }
#endif
      silu_mul_row_scalar(in + 2 * r * n, in + (2 * r + 1) * n, o + r * n, n);
    }
  });
  return out;
}

// Rotates every head of qk [T, heads, dim] (any token and head strides, dim contiguous) in place, token t by the
// row positions[t] of table [max_positions, dim] (the cos of its angles, then their sin).
void rotate_(const torch::Tensor& qk, const torch::Tensor& positions, const torch::Tensor& table) {
  check_float(qk, "qk");
  check_float(table, "table");
  TORCH_CHECK(qk.dim() == 3 && qk.stride(2) == 1 && qk.size(2) % 2 == 0,
              "qk: [T, heads, dim], dim even and contiguous");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous() && table.size(1) == qk.size(2),
              "table: contiguous [max_positions, dim]");
  TORCH_CHECK(positions.dtype() == torch::kInt64 && positions.dim() == 1 && positions.is_contiguous() &&
                  positions.device().is_cpu() && positions.size(0) == qk.size(0),
              "positions: contiguous int64 on the CPU, one per token");
  const int64_t tokens = qk.size(0), heads = qk.size(1), dim = qk.size(2), half = dim / 2;
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < table.size(0), "position ", pos[t], " outside the table's ", table.size(0));
  float* x = qk.data_ptr<float>();
  const float* rows = table.data_ptr<float>();
  const int64_t token_stride = qk.stride(0), head_stride = qk.stride(1);
  const bool avx2 = use_avx2() && half % 8 == 0;
  at::parallel_for(0, tokens, grain_rows(heads * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = rows + pos[t] * dim;
      for (int64_t h = 0; h < heads; ++h) {
        float* head = x + t * token_stride + h * head_stride;
#if defined(__x86_64__)
        if (avx2) {
          rotate_head_avx2(head, cos, cos + half, half);
          continue;
        }
#endif
        rotate_head_scalar(head, cos, cos + half, half);
      }
    }
  });
}

}  // namespace

torch::Tensor tidegate_ops::rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return ::rms_norm(x, weight, eps);
}
torch::Tensor tidegate_ops::add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                         const torch::Tensor& weight, double eps) {
  return ::add_rms_norm(x, residual, weight, eps);
}
torch::Tensor tidegate_ops::silu_and_mul(const torch::Tensor& gate_up) { return ::silu_and_mul(gate_up); }
void tidegate_ops::rotate_(const torch::Tensor& qk, const torch::Tensor& positions, const torch::Tensor& table) {
  ::rotate_(qk, positions, table);
}

TORCH_LIBRARY_FRAGMENT(tidegate, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor", &add_rms_norm);
  m.def("silu_and_mul(Tensor gate_up) -> Tensor", &silu_and_mul);
  m.def("rotate_(Tensor(a!) qk, Tensor positions, Tensor table) -> ()", &rotate_);
}
