#include "models/decoder.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace longwave::models {

decoder::decoder(gpt& model, std::vector<int64_t> prompt) : model_(model), ids_(std::move(prompt)) {
  if (ids_.empty()) throw std::invalid_argument("decoder: the prompt has no tokens");
  read_last(model_.spec().seq_len);
}

void decoder::push(int64_t token) {
  ids_.push_back(token);
  if (cache_.length() == model_.spec().seq_len) {
    read_last(std::max<int64_t>(1, model_.spec().seq_len / 2));
    return;
  }
  const auto idx = at::tensor({token}, at::kLong).view({1, 1}).to(model_.device());
  logits_ = model_.logits(idx, cache_).select(1, 0)[0].to(at::kFloat);
}

void decoder::read_last(int64_t keep) {
  cache_ = {};
  const int64_t n = std::min<int64_t>(keep, static_cast<int64_t>(ids_.size()));
  const std::vector<int64_t> window(ids_.end() - n, ids_.end());
  const auto idx = at::tensor(window, at::kLong).view({1, n}).to(model_.device());
  logits_ = model_.logits(idx, cache_).select(1, n - 1)[0].to(at::kFloat);
}

}  // namespace longwave::models
