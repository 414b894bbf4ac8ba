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

// A layer's matrix: one block matrix, or several of different kinds stacked along the output rows (a merged
// projection the file keeps in two types, quantized_linear.py's StackedWeight), their outputs side by side.
using Matrix = std::vector<Block>;

struct Layer {
  torch::Tensor input_norm, post_norm;
  c10::optional<torch::Tensor> qkv_bias;
  Matrix qkv, o, gate_up, down;
};

constexpr size_t kLayerTensors = 3;  // input_norm, post_norm, qkv_bias; then quants, scales, mins a part

c10::optional<torch::Tensor> present(const torch::Tensor& t) {
  return t.numel() > 0 ? c10::optional<torch::Tensor>(t) : c10::nullopt;  // empty: absent
}

class DecodeStack {
 public:
  // `parts`: four a layer (how many block matrices make qkv, o, gate_up and down); `tensors`: kLayerTensors a
  // layer (an empty tensor for an absent bias), then quants, scales and mins for each part (mins empty where the
  // kind has none); `kinds` and `out_features`: one a part (its Kind and output rows).
  DecodeStack(const std::vector<torch::Tensor>& tensors, const std::vector<int64_t>& kinds,
              const std::vector<int64_t>& out_features, const std::vector<int64_t>& parts, int64_t activation_bits,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale,
              torch::Tensor final_norm, torch::Tensor cos_sin)
      : bits_(activation_bits), heads_(num_heads), kv_heads_(num_kv_heads), dim_(head_dim), eps_(eps),
        scale_(scale), final_norm_(std::move(final_norm)), cos_sin_(std::move(cos_sin)) {
    TORCH_CHECK(parts.size() % 4 == 0 && kinds.size() == out_features.size(), "4 matrices a layer, a kind a part");
    size_t t = 0, part = 0;
    auto matrix = [&](int64_t count) {
      Matrix m;
      for (int64_t i = 0; i < count; ++i, ++part, t += 3) {
        TORCH_CHECK(t + 3 <= tensors.size() && part < kinds.size(), "fewer tensors than parts");
        m.push_back({tensors[t], tensors[t + 1], present(tensors[t + 2]), kinds[part], out_features[part]});
      }
      return m;
    };
    for (size_t i = 0; i < parts.size(); i += 4) {
      TORCH_CHECK(t + kLayerTensors <= tensors.size(), "fewer tensors than layers");
      Layer layer{tensors[t], tensors[t + 1], present(tensors[t + 2]), {}, {}, {}, {}};
      t += kLayerTensors;
      layer.qkv = matrix(parts[i]);
      layer.o = matrix(parts[i + 1]);
      layer.gate_up = matrix(parts[i + 2]);
      layer.down = matrix(parts[i + 3]);
      layers_.push_back(std::move(layer));
    }
    TORCH_CHECK(t == tensors.size() && part == kinds.size(), "more tensors than parts");
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
  torch::Tensor linear(const torch::Tensor& x, const Matrix& w) const {
    std::vector<torch::Tensor> outs;
    for (const Block& b : w) outs.push_back(tidegate_ops::block_linear(x, b.quants, b.scales, b.mins, b.kind, bits_,
                                                                       b.out_features));
    return outs.size() == 1 ? outs[0] : torch::cat(outs, 1);
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
                          const std::vector<int64_t>&, int64_t, int64_t, int64_t, int64_t, double, double, torch::Tensor, torch::Tensor>())
      .def("run", &DecodeStack::run, pybind11::call_guard<pybind11::gil_scoped_release>());
}
