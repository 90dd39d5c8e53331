#pragma once
// Error feedback for lossy wire codecs: the part of a contribution that quantization dropped this round is
// added to the next round's contribution, so the decoded values' running sum tracks the true running sum.
#include <cstddef>
#include <utility>
#include <vector>

namespace longwave::comm {

/// The residual of one node's contribution, over a flat vector of n values. Per round and chunk
/// [offset, offset + n): add_residual(x), encode x, decode it locally, then update(x, decoded).
/// Not thread-safe; disjoint ranges may be used from one thread in any order.
class error_feedback {
 public:
  /// A zero residual for a vector of n values.
  explicit error_feedback(size_t n);

  /// A residual restored from a checkpoint (exact resume).
  explicit error_feedback(std::vector<float> residual) : residual_(std::move(residual)) {}

  /// x[i] += residual[offset + i] for i < n (before encoding). offset + n must be <= size() (LW_ASSERT).
  void add_residual(float* x, size_t n, size_t offset);

  /// residual[offset + i] = x_with_residual[i] - decoded[i]: what the receivers did not get this round.
  /// decoded must be this node's own decode of what it sent. offset + n must be <= size() (LW_ASSERT).
  void update(const float* x_with_residual, const float* decoded, size_t n, size_t offset);

  /// Zeroes the residual (e.g. after a round was abandoned or the global parameters were reloaded).
  void reset();

  /// The residual, one value per element of the vector.
  const std::vector<float>& residual() const { return residual_; }

  /// Number of values covered.
  size_t size() const { return residual_.size(); }

 private:
  std::vector<float> residual_;
};

}  // namespace longwave::comm
