// The row-wise ops around a decoder layer's matrix products, for float32 rows on the CPU: each is one C++
// call where torch runs several small ops (F.rms_norm alone is about nine), and a decode step's rows are so
// small that those calls' overhead, not their arithmetic, is what they cost.
//
// - rms_norm: weight * x / sqrt(mean(x^2) + eps) per row, rounded as transformers' LlamaRMSNorm rounds
//   (x * inv_rms first, then the weight). The sum of squares is accumulated in double, so that its order
//   (not torch's) leaves the mean correctly rounded; the result equals torch's to within an ulp or so.
// - add_rms_norm: residual += x in place, then the norm of the new residual, in one pass per row (the row
//   stays in L1 between its two reads).
// Rows are split over torch's threads only when there are many (prefill): a decode step's norm takes a few
// microseconds, less than waking a worker. An AVX2+FMA path is chosen at run time; a scalar path runs
// elsewhere and for tests. Nothing needs AVX-512.
//
// Registered as torch.ops.tidegate.*, a fragment of the library paged_attention.cpp defines.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "vector_math.h"

namespace {

using namespace tidegate_simd;

constexpr int64_t kSerialFloats = 1 << 16;  // a call on fewer floats runs on the calling thread

std::atomic<bool> scalar_only{false};  // set by tests, so that the portable path runs on AVX2 machines too

bool use_avx2() { return cpu_has_avx2() && !scalar_only.load(); }

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

void check_float(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dtype() == torch::kFloat32 && t.device().is_cpu() && t.dim() >= 1, name,
              ": float32 on the CPU, with at least one dimension");
}

// The norm of each row of x (after residual += x, where a residual is given) into a new tensor.
torch::Tensor norm_rows(const torch::Tensor& x, float* residual, const torch::Tensor& weight, double eps) {
  const int64_t n = weight.numel(), rows = n > 0 ? x.numel() / n : 0;
  torch::Tensor out = torch::empty_like(x);
  const float* xs = x.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, kSerialFloats / std::max<int64_t>(n, 1));
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  const bool avx2 = use_avx2();
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
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

void set_scalar_only(bool value) { scalar_only.store(value); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(tidegate, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor", &add_rms_norm);
  m.def("elementwise_uses_avx2() -> bool", &use_avx2);
  m.def("elementwise_set_scalar_only(bool value) -> ()", &set_scalar_only);
}
