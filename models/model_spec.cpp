// Preset table, closed-form parameter count and memory estimate of the Llama-style GPT.
#include "models/model_spec.hpp"

#include <algorithm>
#include <stdexcept>

#include "runtime/errors/errors.hpp"

namespace longwave::models {

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names{"tiny", "small", "150m", "1b"};
  return names;
}

namespace {

model_spec with_shape(const std::string& name, const config::model_shape& sh, int64_t vocab_size,
                      int64_t seq_len) {
  model_spec s;
  s.preset = name;
  s.vocab_size = vocab_size;
  s.seq_len = seq_len;
  s.dim = sh.dim, s.n_layers = sh.layers, s.n_heads = sh.heads, s.n_kv_heads = sh.kv_heads;
  s.ffn_hidden = sh.ffn_hidden;
  return s;
}

config::model_shape shape_of(const model_spec& s) {
  return {s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.ffn_hidden};
}

}  // namespace

model_spec preset_spec(const std::string& name, int64_t vocab_size, int64_t seq_len) {
  if (std::find(preset_names().begin(), preset_names().end(), name) == preset_names().end())
    throw std::invalid_argument("unknown model preset '" + name + "' (allowed: tiny, small, 150m, 1b)");
  return with_shape(name, config::preset_shape(name), vocab_size, seq_len);
}

model_spec spec_of(const config::model_section& m, int64_t vocab_size) {
  return with_shape(m.preset, config::resolved_shape(m), vocab_size, m.seq_len);
}

std::string model_label(const model_spec& s) {
  const auto sh = shape_of(s);
  if (sh == config::preset_shape(s.preset)) return s.preset;
  return s.preset + " dim=" + std::to_string(sh.dim) + " layers=" + std::to_string(sh.layers) +
         " heads=" + std::to_string(sh.heads) + " kv_heads=" + std::to_string(sh.kv_heads) +
         " ffn_hidden=" + std::to_string(sh.ffn_hidden);
}

int64_t closed_form_param_count(const model_spec& s) {
  const int64_t d = s.dim, kv = s.kv_dim();
  const int64_t per_layer = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * s.ffn_hidden;
  return s.vocab_size * d + s.n_layers * per_layer + d;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_layout(const model_spec& s) {
  const int64_t d = s.dim, kv = s.kv_dim(), f = s.ffn_hidden;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"tok_emb", {s.vocab_size, d}});  // also the output head (tied)
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "attn_norm", {d}});
    out.push_back({p + "wq", {d, d}});
    out.push_back({p + "wk", {kv, d}});
    out.push_back({p + "wv", {kv, d}});
    out.push_back({p + "wo", {d, d}});
    out.push_back({p + "mlp_norm", {d}});
    out.push_back({p + "w_gate", {f, d}});
    out.push_back({p + "w_up", {f, d}});
    out.push_back({p + "w_down", {d, f}});
  }
  out.push_back({"final_norm", {d}});
  return out;
}

std::vector<flat_ranges> fragment_ranges(const model_spec& s, int64_t p, bool strided) {
  LW_ASSERT(p >= 1 && p <= s.n_layers, "fragment count must be between 1 and the number of layers");
  std::vector<flat_ranges> out(static_cast<size_t>(p));
  auto fragment_of_layer = [&](int64_t l) { return strided ? l % p : l * p / s.n_layers; };
  auto add = [&](int64_t f, int64_t off, int64_t len) {
    auto& r = out[static_cast<size_t>(f)];
    if (!r.empty() && r.back().first + r.back().second == off)
      r.back().second += len;
    else
      r.emplace_back(off, len);
  };
  int64_t off = 0;
  for (const auto& [name, shape] : parameter_layout(s)) {
    int64_t len = 1;
    for (auto d : shape) len *= d;
    int64_t layer = s.n_layers - 1;  // final_norm
    if (name == "tok_emb") layer = 0;
    if (name.rfind("layers.", 0) == 0) layer = std::stoll(name.substr(7));
    add(fragment_of_layer(layer), off, len);
    off += len;
  }
  return out;
}

int64_t range_size(const flat_ranges& r) {
  int64_t n = 0;
  for (const auto& x : r) n += x.second;
  return n;
}

int64_t training_memory_bytes(const model_spec& s, int64_t batch_size, bool bf16) {
  const int64_t n = closed_form_param_count(s);
  const int64_t wbytes = bf16 ? 2 : 4;
  // weights + grads in model dtype; fp32 master (bf16 only); AdamW m and v in fp32.
  const int64_t state = n * (2 * wbytes + (bf16 ? 4 : 0) + 8);
  // Activations kept for backward: ~ (14*d + 2*ffn) values per token per layer, plus the logits.
  const int64_t tokens = batch_size * s.seq_len;
  const int64_t act = tokens * (s.n_layers * (14 * s.dim + 3 * s.ffn_hidden) + 2 * s.vocab_size) * wbytes;
  return state + act;
}

double process_memory_bytes(const model_spec& s, int64_t batch_size, bool bf16, int64_t workers) {
  return static_cast<double>(training_memory_bytes(s, batch_size, bf16)) * static_cast<double>(workers) +
         12.0 * static_cast<double>(closed_form_param_count(s));
}

int64_t evaluation_memory_bytes(const model_spec& s, int64_t batch_size, bool bf16) {
  const int64_t n = closed_form_param_count(s);
  // theta in fp32 beside the model's weights; a forward pass without autograd keeps a layer's activations
  // at a time, and the logits with their softmax.
  const int64_t tokens = batch_size * s.seq_len;
  return n * (4 + (bf16 ? 2 : 4)) + tokens * (6 * s.dim + 2 * s.ffn_hidden + 3 * s.vocab_size) * 4;
}

}  // namespace longwave::models
