// The preset shapes and the [model] shape overrides, resolved and checked.
#include "config/model_shape.hpp"

#include <fmt/format.h>

#include "config/config_loader.hpp"

namespace longwave::config {

model_shape preset_shape(const std::string& name) {
  if (name == "tiny") return {192, 4, 6, 6, 512};       // ~1.8M parameters with bytes: the CPU demo and tests
  if (name == "small") return {384, 8, 6, 6, 1024};     // ~14M
  if (name == "150m") return {1024, 12, 16, 16, 2688};  // OpenDiLoCo's 150M Llama
  if (name == "1b") return {2048, 22, 32, 4, 5632};     // TinyLlama-1.1B: 4 KV heads
  throw config_error(
      "model.preset",
      fmt::format("model.preset = \"{}\": unknown preset; allowed values are tiny, small, 150m, 1b", name));
}

model_shape resolved_shape(const model_section& m) {
  model_shape s = preset_shape(m.preset);
  auto take = [](int64_t& field, int64_t v) {
    if (v > 0) field = v;
  };
  take(s.dim, m.dim);
  take(s.layers, m.layers);
  const bool mha = s.kv_heads == s.heads;  // the preset gives every head its own KV head
  take(s.heads, m.heads);
  take(s.kv_heads, m.kv_heads);
  if (mha && m.kv_heads == 0) s.kv_heads = s.heads;  // and stays so with other heads
  take(s.ffn_hidden, m.ffn_hidden);
  return s;
}

void check_shape(const model_section& m) {
  const model_shape s = resolved_shape(m);
  // Blame the key the config set: with a preset's heads and an overridden dim, dim is what broke the rule.
  const bool heads_set = m.heads > 0;
  if (s.dim % s.heads != 0) {
    const std::string key = heads_set || m.dim == 0 ? "model.heads" : "model.dim";
    throw config_error(key, fmt::format("{} = {}: model.heads ({}) must divide model.dim ({}), so that every "
                                        "head has dim / heads channels",
                                        key, key == "model.heads" ? s.heads : s.dim, s.heads, s.dim));
  }
  if (s.kv_heads > s.heads || s.heads % s.kv_heads != 0) {
    const std::string key = m.kv_heads > 0 || !heads_set ? "model.kv_heads" : "model.heads";
    throw config_error(key,
                       fmt::format("{} = {}: model.kv_heads ({}) must divide model.heads ({}), so that "
                                   "each KV head serves the same number of query heads",
                                   key, key == "model.kv_heads" ? s.kv_heads : s.heads, s.kv_heads, s.heads));
  }
  if ((s.dim / s.heads) % 2 != 0) {
    const std::string key = heads_set || m.dim == 0 ? "model.heads" : "model.dim";
    throw config_error(
        key, fmt::format("{} = {}: the head dim model.dim / model.heads = {} / {} = {} must be "
                         "even for rotary position embeddings (RoPE)",
                         key, key == "model.heads" ? s.heads : s.dim, s.dim, s.heads, s.dim / s.heads));
  }
}

}  // namespace longwave::config
