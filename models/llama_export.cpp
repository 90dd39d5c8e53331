// Hugging Face Llama names and layout of our parameters, and the LlamaForCausalLM config.json.
#include "models/llama_export.hpp"

#include <cstring>
#include <map>
#include <stdexcept>

#include "runtime/errors/errors.hpp"
#include "runtime/json/json_pretty.hpp"

namespace longwave::models {

namespace {

// Rows of a [heads * D, C] q or k projection, from our RoPE order (pairs (2i, 2i+1) of each head) to
// rotate-half order (pairs (i, i + D/2)), so HF Llama's rotary embedding rotates the same pairs we do.
std::vector<float> to_rotate_half(const float* w, int64_t heads, int64_t head_dim, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(heads * head_dim * cols));
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t to = h * head_dim + a * half + i, from = h * head_dim + 2 * i + a;
        std::memcpy(out.data() + to * cols, w + from * cols, static_cast<size_t>(cols) * sizeof(float));
      }
  return out;
}

}  // namespace

std::string llama_name(const std::string& ours) {
  static const std::map<std::string, std::string> layer_names{
      {"attn_norm", "input_layernorm"}, {"wq", "self_attn.q_proj"}, {"wk", "self_attn.k_proj"},
      {"wv", "self_attn.v_proj"},       {"wo", "self_attn.o_proj"}, {"mlp_norm", "post_attention_layernorm"},
      {"w_gate", "mlp.gate_proj"},      {"w_up", "mlp.up_proj"},    {"w_down", "mlp.down_proj"}};
  if (ours == "tok_emb") return "model.embed_tokens.weight";
  if (ours == "final_norm") return "model.norm.weight";
  const auto dot = ours.find('.', 7);
  if (ours.rfind("layers.", 0) == 0 && dot != std::string::npos) {
    const auto it = layer_names.find(ours.substr(dot + 1));
    if (it != layer_names.end()) return "model." + ours.substr(0, dot + 1) + it->second + ".weight";
  }
  throw std::invalid_argument("no Hugging Face Llama name for parameter '" + ours + "'");
}

llama_weights::llama_weights(const model_spec& s, const float* theta) {
  const auto layout = parameter_layout(s);
  permuted_.reserve(2 * static_cast<size_t>(s.n_layers));  // views point into these: no reallocation
  int64_t off = 0;
  for (const auto& [name, shape] : layout) {
    safetensor_view t{llama_name(name), shape, theta + off};
    const bool q = name.size() > 3 && name.compare(name.size() - 3, 3, ".wq") == 0;
    const bool k = name.size() > 3 && name.compare(name.size() - 3, 3, ".wk") == 0;
    if (q || k) {
      permuted_.push_back(to_rotate_half(t.data, q ? s.n_heads : s.n_kv_heads, s.head_dim(), s.dim));
      t.data = permuted_.back().data();
    }
    off += t.numel();
    tensors_.push_back(std::move(t));
  }
  LW_ASSERT(off == closed_form_param_count(s), "parameter layout does not match the closed-form count");
}

std::string llama_config_json(const model_spec& s) {
  runtime::json_pretty j;
  j.add("architectures", std::vector<std::string>{"LlamaForCausalLM"})
      .add("model_type", "llama")
      .add("torch_dtype", "float32")
      .add("vocab_size", s.vocab_size)
      .add("hidden_size", s.dim)
      .add("intermediate_size", s.ffn_hidden)
      .add("num_hidden_layers", s.n_layers)
      .add("num_attention_heads", s.n_heads)
      .add("num_key_value_heads", s.n_kv_heads)
      .add("head_dim", s.head_dim())
      .add("max_position_embeddings", s.seq_len)
      .add("hidden_act", "silu")
      .add("rms_norm_eps", s.norm_eps)
      .add("rope_theta", s.rope_theta)
      .add_null("rope_scaling")
      .add("tie_word_embeddings", true)  // no lm_head.weight: the head is the embedding
      .add("attention_bias", false)
      .add("mlp_bias", false)
      .add("attention_dropout", 0.0)
      .add("initializer_range", 0.02)
      .add("use_cache", true);
  return j.str() + "\n";
}

}  // namespace longwave::models
