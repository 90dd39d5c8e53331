#pragma once
// Our flat parameter buffer as Hugging Face Llama weights (LlamaForCausalLM names, q/k rows in its
// rotate-half RoPE order) and the config.json that describes them. No torch.
#include <string>
#include <vector>

#include "models/model_spec.hpp"
#include "models/safetensors.hpp"

namespace longwave::models {

/// The tensors of one model in Hugging Face Llama's names and layout. Most point into the flat buffer they
/// were made from (which must outlive them); the q and k projections point into `permuted_`.
class llama_weights {
 public:
  /// theta: closed_form_param_count(s) fp32 values in parameter_layout order.
  llama_weights(const model_spec& s, const float* theta);
  llama_weights(const llama_weights&) = delete;  // a copy's views would point into this one's permuted_
  llama_weights& operator=(const llama_weights&) = delete;

  /// model.embed_tokens.weight, model.layers.N.*, model.norm.weight; no lm_head.weight (the head is tied).
  const std::vector<safetensor_view>& tensors() const { return tensors_; }

 private:
  std::vector<std::vector<float>> permuted_;
  std::vector<safetensor_view> tensors_;
};

/// The Hugging Face name of one of our parameters (parameter_layout's names), e.g. "layers.3.wq" ->
/// "model.layers.3.self_attn.q_proj.weight". Throws std::invalid_argument on a name it does not know.
std::string llama_name(const std::string& ours);

/// config.json of a LlamaForCausalLM with this shape: float32, tied embeddings, no biases, SiLU.
std::string llama_config_json(const model_spec& s);

}  // namespace longwave::models
