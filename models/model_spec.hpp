#pragma once
// Shapes of the Llama-style GPT presets (tiny, small, 150m, 1b), their closed-form parameter count and a
// memory estimate for training.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/model_shape.hpp"

namespace longwave::models {

/// Architecture of one Llama-style decoder: RMSNorm, RoPE, causal attention (optionally grouped-query),
/// SwiGLU MLP, tied output head.
struct model_spec {
  std::string preset;
  int64_t vocab_size = 256;
  int64_t dim = 192;
  int64_t n_layers = 4;
  int64_t n_heads = 6;
  int64_t n_kv_heads = 6;  ///< < n_heads: grouped-query attention, as TinyLlama
  int64_t ffn_hidden = 512;
  int64_t seq_len = 128;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_dim() const { return n_kv_heads * head_dim(); }
};

/// The named preset with the given vocabulary and context. Throws std::invalid_argument on an unknown name.
model_spec preset_spec(const std::string& name, int64_t vocab_size, int64_t seq_len);

/// The model of a [model] section: its preset with the shape overrides applied (config::resolved_shape).
model_spec spec_of(const config::model_section& m, int64_t vocab_size);

/// The model's name in checkpoints and logs: the preset's name, plus the shape when it differs from the
/// preset's, e.g. "tiny dim=256 layers=4 heads=4 kv_heads=4 ffn_hidden=512". A resume checks it.
std::string model_label(const model_spec& s);

/// Names of all presets, in size order.
const std::vector<std::string>& preset_names();

/// Closed-form parameter count: V*d + L*(2d + 2*d*d + 2*d*kv + 3*d*ffn) + d.
int64_t closed_form_param_count(const model_spec& s);

/// Parameter tensors in flat-buffer order: (name, shape). Their sizes sum to closed_form_param_count.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_layout(const model_spec& s);

/// [offset, length) ranges of the flat parameter buffer, in increasing order.
using flat_ranges = std::vector<std::pair<int64_t, int64_t>>;

/// Streaming DiLoCo's fragments: for each of p fragments, the ranges of its parameters. Layer l belongs to
/// fragment l mod p (strided) or l * p / n_layers (sequential); the token embedding (also the output head)
/// goes with layer 0's fragment, the final norm with the last layer's. Adjacent ranges are merged. Every
/// parameter is in exactly one fragment. Requires 1 <= p <= n_layers.
std::vector<flat_ranges> fragment_ranges(const model_spec& s, int64_t p, bool strided);

/// Values in a set of ranges.
int64_t range_size(const flat_ranges& r);

/// Rough bytes for training one replica: weights, grads, fp32 master, AdamW moments, activations.
int64_t training_memory_bytes(const model_spec& s, int64_t batch_size, bool bf16);

/// Rough bytes for one process's training, in double (workers x a replica can pass int64): `workers`
/// replicas (training_memory_bytes) and what the process keeps once, theta_global, the outer momentum and the
/// round's average: three fp32 copies (a 143M-parameter run of one worker peaked at 4.15 GiB, the replica
/// alone estimated at 2.24 GiB).
double process_memory_bytes(const model_spec& s, int64_t batch_size, bool bf16, int64_t workers);

/// Rough bytes for evaluating one checkpoint (`longwave eval`): theta, the model's weights, one forward pass.
int64_t evaluation_memory_bytes(const model_spec& s, int64_t batch_size, bool bf16);

}  // namespace longwave::models
