// Sparse error feedback: decay and add, encode the residual, subtract this node's own decode of the message.
#include "comm/sparse_error_feedback.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/errors/errors.hpp"

namespace longwave::comm {
namespace {

void check_decay(float decay) {
  LW_ASSERT(decay >= 0.0f && decay <= 1.0f,
            "sparse_error_feedback: ef_decay = " + std::to_string(decay) + " is outside [0, 1]");
}

}  // namespace

sparse_error_feedback::sparse_error_feedback(size_t n, float decay) : residual_(n, 0.0f), decay_(decay) {
  check_decay(decay);
}

sparse_error_feedback::sparse_error_feedback(std::vector<float> residual, float decay)
    : residual_(std::move(residual)), decay_(decay) {
  check_decay(decay);
}

bool sparse_error_feedback::encode(const float* delta, size_t n, size_t offset, std::byte* dst,
                                   const sparse_options& o) {
  LW_ASSERT(offset <= residual_.size() && n <= residual_.size() - offset,
            "sparse_error_feedback: range [" + std::to_string(offset) + ", +" + std::to_string(n) +
                ") outside " + std::to_string(residual_.size()));
  float* e = residual_.data() + offset;
  for (size_t i = 0; i < n; ++i) e[i] = decay_ * e[i] + delta[i];
  if (!sparse_encode(e, n, dst, o)) return false;
  // Our own bytes: the decode cannot fail, and it is exactly what every receiver adds.
  const bool decoded = sparse_decode_subtract(dst, sparse_encoded_size(n, o), n, e, o);
  LW_ASSERT(decoded, "sparse_error_feedback: a message this node encoded does not decode");
  return true;
}

bool sparse_error_feedback::accumulate_and_gather(const float* delta, const size_t* mask, size_t k,
                                                  float* v) {
  LW_ASSERT(k == 0 || mask[k - 1] < residual_.size(), "sparse_error_feedback: mask index out of range");
  float* e = residual_.data();
  for (size_t i = 0; i < residual_.size(); ++i) e[i] = decay_ * e[i] + delta[i];
  bool finite = true;
  for (size_t i = 0; i < k; ++i) {
    v[i] = e[mask[i]];
    finite = finite && std::isfinite(v[i]);
  }
  return finite;
}

void sparse_error_feedback::subtract(const size_t* mask, size_t k, const float* sent) {
  LW_ASSERT(k == 0 || mask[k - 1] < residual_.size(), "sparse_error_feedback: mask index out of range");
  for (size_t i = 0; i < k; ++i) residual_[mask[i]] -= sent[i];
}

void sparse_error_feedback::reset() {
  std::fill(residual_.begin(), residual_.end(), 0.0f);
}

}  // namespace longwave::comm
