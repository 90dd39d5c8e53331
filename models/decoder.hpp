#pragma once
// Text generation's forward passes: a gpt reads a prompt once into a KV cache, then one position a token.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "models/gpt.hpp"

namespace longwave::models {

/// Feeds a growing token sequence to a model over its KV cache. Once the cache holds the whole context
/// (seq_len positions), the next token starts a fresh cache from the sequence's last half.
class decoder {
 public:
  /// Reads the last seq_len tokens of `prompt` (one at least). `model` must outlive the decoder.
  decoder(gpt& model, std::vector<int64_t> prompt);
  /// The next token's logits [V], fp32.
  const at::Tensor& next_logits() const { return logits_; }
  /// Appends `token` to the sequence and computes the logits of the token after it.
  void push(int64_t token);
  /// The sequence so far: the prompt and every token pushed.
  const std::vector<int64_t>& tokens() const { return ids_; }

 private:
  void read_last(int64_t keep);  // a fresh cache of the sequence's last `keep` tokens

  gpt& model_;
  std::vector<int64_t> ids_;
  gpt::kv_cache cache_;
  at::Tensor logits_;
};

}  // namespace longwave::models
