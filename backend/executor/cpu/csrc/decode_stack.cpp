// A decode step's decoder layers in one call (backend/executor/fused_step.py), for steps whose every row the
// paged kernel attends (decodes and speculative verifications) and whose matrices are kept in GGML blocks. It
// calls the kernels that DecoderLayer.forward calls, in the same order, on the same views, so the hidden states
// and the KV written are the same bits; what it saves is the Python between them: ~19 torch-level calls a
// layer, about a fifth of a one-token step of SmolLM2-135M on two cores (docs/benchmarks.md).
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "model_ops.h"

namespace {

struct Block {  // one matrix in the block kernel's arrays (block_linear.py's BlockWeight)
  torch::Tensor quants, scales;
  c10::optional<torch::Tensor> mins;
  int64_t kind, out_features;
};

struct Layer {
  torch::Tensor input_norm, post_norm;
  c10::optional<torch::Tensor> qkv_bias;
  Block qkv, o, gate_up, down;
};

constexpr size_t kTensorsPerLayer = 15;  // input_norm, post_norm, qkv_bias, then quants, scales, mins x 4

c10::optional<torch::Tensor> present(const torch::Tensor& t) {
  return t.numel() > 0 ? c10::optional<torch::Tensor>(t) : c10::nullopt;  // empty: absent
}

class DecodeStack {
 public:
  // `tensors`: kTensorsPerLayer a layer (an empty tensor for an absent bias or Q4_0/Q8_0 minimums), `kinds` and
  // `out_features` four a layer (the Kind and output rows of qkv, o, gate_up, down).
  DecodeStack(const std::vector<torch::Tensor>& tensors, const std::vector<int64_t>& kinds,
              const std::vector<int64_t>& out_features, int64_t activation_bits,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale,
              torch::Tensor final_norm, torch::Tensor cos_sin)
      : bits_(activation_bits), heads_(num_heads), kv_heads_(num_kv_heads), dim_(head_dim), eps_(eps),
        scale_(scale), final_norm_(std::move(final_norm)), cos_sin_(std::move(cos_sin)) {
    TORCH_CHECK(tensors.size() % kTensorsPerLayer == 0 && kinds.size() * 15 == tensors.size() * 4 &&
                out_features.size() == kinds.size(), "15 tensors, 4 kinds and 4 output sizes a layer");
    for (size_t i = 0; i < tensors.size(); i += kTensorsPerLayer) {
      const torch::Tensor* t = &tensors[i];
      const int64_t* k = &kinds[i / kTensorsPerLayer * 4];
      const int64_t* out = &out_features[i / kTensorsPerLayer * 4];
      auto block = [&](int j) { return Block{t[3 + 3 * j], t[4 + 3 * j], present(t[5 + 3 * j]), k[j], out[j]}; };
      layers_.push_back({t[0], t[1], present(t[2]), block(0), block(1), block(2), block(3)});
    }
  }

  // Hidden states after the final norm for x [T, hidden] (the step's embedded tokens, which become the
  // residual stream), writing each layer's new keys and values into its caches at `slots`.
  torch::Tensor run(torch::Tensor x, const torch::Tensor& positions, const std::vector<torch::Tensor>& k_caches,
                    const std::vector<torch::Tensor>& v_caches, const torch::Tensor& slots,
                    const torch::Tensor& starts, const torch::Tensor& q_lens, const torch::Tensor& context_lens,
                    const torch::Tensor& block_tables) const {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one cache pair a layer");
    const int64_t t = x.size(0), q_size = heads_ * dim_, kv_size = kv_heads_ * dim_;
    torch::Tensor residual;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      torch::Tensor h;
      if (residual.defined()) {
        h = tidegate_ops::add_rms_norm(x, residual, layer.input_norm, eps_);
      } else {  // before the first layer the embedded tokens are the residual stream
        h = tidegate_ops::rms_norm(x, layer.input_norm, eps_);
        residual = x;
      }
      torch::Tensor qkv = linear(h, layer.qkv);
      if (layer.qkv_bias) qkv = qkv + *layer.qkv_bias;
      const torch::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({t, -1, dim_});
      tidegate_ops::rotate_(qk, positions, cos_sin_);
      const torch::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, kv_heads_, dim_});
      tidegate_ops::write_kv(qk.narrow(1, heads_, kv_heads_), v, k_caches[i], v_caches[i], slots);
      torch::Tensor o = torch::empty({t, heads_, dim_}, x.options());
      tidegate_ops::paged_attention(qk.narrow(1, 0, heads_), k_caches[i], v_caches[i], o, starts, q_lens,
                                    context_lens, block_tables, scale_);
      h = tidegate_ops::add_rms_norm(linear(o.reshape({t, q_size}), layer.o), residual, layer.post_norm, eps_);
      x = linear(tidegate_ops::silu_and_mul(linear(h, layer.gate_up)), layer.down);
    }
    TORCH_CHECK(residual.defined(), "a model without layers");
    return tidegate_ops::add_rms_norm(x, residual, final_norm_, eps_);
  }

 private:
  torch::Tensor linear(const torch::Tensor& x, const Block& w) const {
    return tidegate_ops::block_linear(x, w.quants, w.scales, w.mins, w.kind, bits_, w.out_features);
  }

  std::vector<Layer> layers_;
  int64_t bits_, heads_, kv_heads_, dim_;
  double eps_, scale_;
  torch::Tensor final_norm_, cos_sin_;
};

}  // namespace

void tidegate_ops::bind_decode_stack(pybind11::module& m) {
  pybind11::class_<DecodeStack>(m, "DecodeStack", "a decode step's decoder layers in one call (fused_step.py)")
      .def(pybind11::init<const std::vector<torch::Tensor>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
                          int64_t, int64_t, int64_t, int64_t, double, double, torch::Tensor, torch::Tensor>())
      .def("run", &DecodeStack::run, pybind11::call_guard<pybind11::gil_scoped_release>());
}
