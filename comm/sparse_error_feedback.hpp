#pragma once
// Error feedback for the sparse codec (SparseLoCo's rule): the residual decays, takes this round's
// pseudo-gradient, is what gets encoded, and keeps exactly the part that the encoded message did not carry.
#include <cstddef>
#include <utility>
#include <vector>

#include "comm/sparse_codec.hpp"

namespace longwave::comm {

/// The residual e of one node's contribution over a flat vector of n values. Per round and range
/// [offset, offset + n): encode(delta, ...) does e <- decay * e + delta, encodes e, then e <- e - decoded.
/// Not thread-safe; disjoint ranges may be used from one thread in any order.
class sparse_error_feedback {
 public:
  /// A zero residual for a vector of n values; decay (ef_decay) must be in [0, 1] (LW_ASSERT).
  sparse_error_feedback(size_t n, float decay);

  /// A residual restored from a checkpoint (exact resume).
  sparse_error_feedback(std::vector<float> residual, float decay);

  /// e[offset + i] = decay * e[offset + i] + delta[i] for i < n, then sparse_encode of that range into dst
  /// (sparse_encoded_size(n, o) bytes), then e[offset + i] -= decoded[i] with the decode of dst itself, so
  /// afterwards e + decoded(dst) == decay * e_old + delta (up to the rounding of one subtraction).
  /// Returns false if the range held NaN or inf: dst is then a poisoned message that every decoder refuses,
  /// and e keeps decay * e_old + delta. offset + n must be <= size() (LW_ASSERT).
  bool encode(const float* delta, size_t n, size_t offset, std::byte* dst, const sparse_options& o);

  /// comm.sparse_indices = "shared", where the indices are given rather than picked: e <- decay * e + delta
  /// over all size() values (delta holds size() values), then, for a strictly increasing mask, v[i] =
  /// e[mask[i]] for i < k. The caller quantizes v as the wire will and hands the result to subtract. Returns
  /// false if v holds NaN or inf.
  bool accumulate_and_gather(const float* delta, const size_t* mask, size_t k, float* v);

  /// e[mask[i]] -= sent[i] for i < k: removes what this node put on the wire (mask strictly increasing, <
  /// size()).
  void subtract(const size_t* mask, size_t k, const float* sent);

  /// Zeroes the residual (e.g. after a round was abandoned or the global parameters were reloaded).
  void reset();

  /// The residual, one value per element of the vector.
  const std::vector<float>& residual() const { return residual_; }

  /// Number of values covered.
  size_t size() const { return residual_.size(); }

  /// ef_decay: the factor on the old residual.
  float decay() const { return decay_; }

 private:
  std::vector<float> residual_;
  float decay_;
};

}  // namespace longwave::comm
