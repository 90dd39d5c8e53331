#pragma once
// The shape of a Llama-style model as [model] gives it: the preset table and the preset with the dim,
// layers, heads, kv_heads and ffn_hidden overrides applied. models/model_spec builds on it.
#include <cstdint>
#include <string>

#include "config/train_config.hpp"

namespace longwave::config {

/// Width, depth and heads of one decoder; every field positive once resolved.
struct model_shape {
  int64_t dim = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  ///< < heads: grouped-query attention
  int64_t ffn_hidden = 0;

  bool operator==(const model_shape& o) const {
    return dim == o.dim && layers == o.layers && heads == o.heads && kv_heads == o.kv_heads &&
           ffn_hidden == o.ffn_hidden;
  }
};

/// The named preset's shape. Throws config_error("model.preset") on an unknown name.
model_shape preset_shape(const std::string& name);

/// The preset's shape with every non-zero override of [model] applied (validate() has checked it).
model_shape resolved_shape(const model_section& m);

/// Throws config_error naming the offending key when the resolved shape is not a model the GPT can build:
/// heads must divide dim, kv_heads must divide heads, and the head dim (dim / heads) must be even for RoPE.
void check_shape(const model_section& m);

}  // namespace longwave::config
