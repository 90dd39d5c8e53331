// Error feedback residual: add before encoding, update from the local decode after.
#include "comm/error_feedback.hpp"

#include <algorithm>
#include <string>

#include "runtime/errors/errors.hpp"

namespace longwave::comm {
namespace {

void check_range(size_t n, size_t offset, size_t size) {
  LW_ASSERT(offset <= size && n <= size - offset, "error_feedback: range [" + std::to_string(offset) + ", +" +
                                                      std::to_string(n) + ") outside " +
                                                      std::to_string(size));
}

}  // namespace

error_feedback::error_feedback(size_t n) : residual_(n, 0.0f) {}

void error_feedback::add_residual(float* x, size_t n, size_t offset) {
  check_range(n, offset, residual_.size());
  const float* r = residual_.data() + offset;
  for (size_t i = 0; i < n; ++i) x[i] += r[i];
}

void error_feedback::update(const float* x_with_residual, const float* decoded, size_t n, size_t offset) {
  check_range(n, offset, residual_.size());
  float* r = residual_.data() + offset;
  for (size_t i = 0; i < n; ++i) r[i] = x_with_residual[i] - decoded[i];
}

void error_feedback::reset() {
  std::fill(residual_.begin(), residual_.end(), 0.0f);
}

}  // namespace longwave::comm
