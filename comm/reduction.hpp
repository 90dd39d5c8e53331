#pragma once
// How a node's contribution crosses the collective: picked once from comm.dtype, comm.error_feedback and
// comm.sparse_indices (dense, dense with error feedback, sparse top-k, sparse with shared indices), then
// applied to every reduce through any comm::collective: the ring, NCCL, or one process's local_collective.
// The one place that decides which dtype goes on the wire.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "comm/codec.hpp"
#include "comm/collective.hpp"
#include "comm/sparse_codec.hpp"

namespace longwave::comm {

/// The [comm] settings a reduction follows; every node of a cluster must use the same.
struct reduction_options {
  /// comm.dtype: fp32, fp16, bf16, int8 (dense), or sparse.
  wire_dtype dtype = wire_dtype::fp32;
  codec_options codec{};
  /// comm.error_feedback: carry what a lossy dense dtype dropped into the next round (sparse always does).
  bool error_feedback = false;
  /// comm.dtype = "sparse": the codec, error feedback's decay, and whether each node's contribution is
  /// clipped to the round's median norm.
  sparse_options sparse{};
  float ef_decay = 0.95f;
  bool robust_clip = false;
  /// comm.sparse_indices = "shared": every node sends the values at the same seeded indices
  /// (comm/shared_mask.hpp, from mask_seed = run.seed) as int8 over the dense collective.
  bool shared_indices = false;
  /// Values the collective's int8 encodes together (shared indices quantize so, as it will).
  size_t shared_chunk = SIZE_MAX;
  uint64_t mask_seed = 0;
};

/// The dtype of the collective's own dense calls under comm.dtype: sparse messages are all-gathered, so a
/// sparse run's dense calls (parameters) are fp32.
wire_dtype dense_dtype(wire_dtype comm_dtype);

/// back[0..m) = what every receiver decodes once x[0..m) went out as one chunk of dtype (x and back may be
/// the same); wire is scratch. False if the codec refused the values (int8 of NaN or inf).
bool round_trip(wire_dtype dtype, const codec_options& codec, const float* x, size_t m, float* back,
                std::vector<std::byte>& wire);

/// Error-feedback residuals by ring label part (the second half of a reduce's label).
using residual_vectors = std::map<uint32_t, std::vector<float>>;

/// Time spent coding outside the collective, and contributions clipped to the median norm.
struct reduction_stats {
  double encode_seconds = 0, decode_seconds = 0;
  uint64_t clipped = 0;
};

/// The weight of a node that only relays zeros yet keeps the ring's total above 0 (diloco.outer = "async":
/// the members not in a merge; a merge whose contributors were all lost then averages to zero instead of
/// failing). Like weight 0, it takes no residual in.
inline constexpr double relay_weight = 1e-6;
/// Whether a contribution of this weight carries the node's error-feedback residual (not a relay's).
inline bool carries_residual(double weight) {
  return weight > relay_weight;
}

/// One node's side of the reduction. Not thread-safe: one communicator calls it.
class reduction {
 public:
  virtual ~reduction() = default;

  /// data[0..n) is this node's contribution (its workers' mean) of weight `weight` (0 or relay_weight: the
  /// node only relays, as a joiner in its observed round: no residual takes it in); afterwards it is the
  /// weighted mean over every node of c. part is the ring label's second part: each has its own residual.
  /// Throws lw_error (diverged for a non-finite residual, malformed_frame for a peer's bad message, or c's
  /// errors).
  virtual void apply(collective& c, uint64_t round, uint32_t part, float* data, size_t n, double weight) = 0;

  /// comm.dtype, for the records.
  virtual wire_dtype dtype() const = 0;
  /// Bytes that n values of one contribution take on the wire, and the fraction of them sent.
  virtual size_t wire_bytes(size_t n) const = 0;
  virtual double density(size_t n) const {
    (void)n;
    return 1.0;
  }

  /// Copies of the residuals (for a checkpoint); load installs them (a resume). Stateless reductions have
  /// none and ignore a load.
  virtual residual_vectors residuals() const { return {}; }
  virtual void load(residual_vectors residuals) { (void)residuals; }
  /// part's residual, if there is one (not a copy).
  virtual const std::vector<float>* residual(uint32_t part) const {
    (void)part;
    return nullptr;
  }
  /// L2 norm of part's residual, if there is one.
  std::optional<double> residual_norm(uint32_t part) const;

  const reduction_stats& stats() const { return stats_; }

 protected:
  reduction_stats stats_;
};

/// The reduction for these settings: dense (error feedback when asked, for fp16, bf16 and int8), sparse
/// top-k, or sparse with shared indices.
std::unique_ptr<reduction> make_reduction(const reduction_options& o);

/// fp32 with no error feedback whatever comm.dtype is: for parameters (eager's final mean), which must reach
/// every node unrounded.
std::unique_ptr<reduction> exact_reduction();

}  // namespace longwave::comm
