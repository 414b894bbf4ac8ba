// The extension's ops as C++ functions, for decode_stack.cpp to call without going back to Python: the same
// functions the registered torch ops and the pybind module run (each source wraps its own at its end).
#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace tidegate_ops {

// block_matmul.cpp
torch::Tensor block_linear(const torch::Tensor& x, const torch::Tensor& quants, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& mins, int64_t kind, int64_t activation_bits,
                           int64_t out_features);
// elementwise.cpp
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                           double eps);
torch::Tensor silu_and_mul(const torch::Tensor& gate_up);
void rotate_(const torch::Tensor& qk, const torch::Tensor& positions, const torch::Tensor& table);
// paged_attention.cpp
void paged_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                     const torch::Tensor& out, const torch::Tensor& starts, const torch::Tensor& q_lens,
                     const torch::Tensor& context_lens, const torch::Tensor& block_tables, double scale);
void write_kv(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& k_cache,
              const torch::Tensor& v_cache, const torch::Tensor& slots);
// k_blocks.cpp: y = x @ W.T for a weight in repacked K-quant super-blocks (kind 3-5), and its Python functions
torch::Tensor k_linear(const torch::Tensor& x, const torch::Tensor& data, int64_t kind, int64_t activation_bits,
                       int64_t out_features);
torch::Tensor k_dequantize(const torch::Tensor& data, int64_t kind, int64_t out_features, const torch::Tensor& ids);
void bind_k_blocks(pybind11::module& m);
// decode_stack.cpp: registers its DecodeStack class on the extension's module
void bind_decode_stack(pybind11::module& m);

}  // namespace tidegate_ops
