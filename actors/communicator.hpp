#pragma once
// The communicator actor: averages pseudo-gradients (or, in ddp mode, gradients). It first averages the
// local workers' tensors in-process (fp32, rank order); in a cluster it then takes part once in the
// all-reduce across nodes (comm.backend: the ring or NCCL), weighted by its worker count, so every node gets
// the mean over all workers.
#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "comm/codec.hpp"
#include "comm/sparse_codec.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::comm {
class collective;
}

namespace longwave::actors {

/// What the communicator needs beyond the local mean.
struct communicator_options {
  /// The all-reduce across nodes (comm/collective.hpp: the ring or NCCL); null when this process is the whole
  /// run.
  std::shared_ptr<comm::collective> collective;
  /// Wire dtype and codec of the collective (every node must agree), and whether this node carries its
  /// quantization residual into the next round (only for lossy dtypes).
  comm::wire_dtype dtype = comm::wire_dtype::fp32;
  comm::codec_options codec{};
  bool error_feedback = false;
  /// comm.dtype = "sparse": the codec's parameters, error feedback's decay (always on for sparse) and whether
  /// each node's contribution is clipped to the round's median norm.
  comm::sparse_options sparse{};
  float ef_decay = 0.95f;
  bool robust_clip = false;
  /// comm.sparse_indices = "shared": every node sends the values at the same seeded indices
  /// (comm/shared_mask.hpp, from mask_seed = run.seed) as int8 over the dense ring, instead of its own top-k
  /// all-gathered.
  bool shared_indices = false;
  /// Values the ring's int8 encodes together (its chunk length for int8): shared indices quantize so.
  size_t shared_chunk = SIZE_MAX;
  uint64_t mask_seed = 0;
  /// Metrics sink for all-reduce time and bytes; may be null.
  runtime::metrics_actor metrics;
  /// The next and previous nodes' names (labels of the bytes-sent and bytes-received counters).
  std::string next_peer, prev_peer;
  /// Append one "allreduce" line per reduce to metrics.jsonl (not in ddp, which reduces every step). Its
  /// "label" is the ring label's second part: 0 for a round's average, j for streaming's j-th sync of the
  /// round, higher for the reduces that finish a run (eager's mean of the parameters, streaming's last
  /// syncs).
  bool log_events = true;
  /// A node that joined a running cluster: in this round it contributes weight 0 (it trained no steps).
  uint64_t observe_round = 0;
};

/// Messages: runtime::communicator_actor. (reduce, request) -> the mean of request.parts. The local sum is in
/// rank order in fp32 (deterministic, independent of arrival order); the ring result is bit-identical on
/// every node. Non-finite values fail the round before anything is sent. Each ring label part has its own
/// error-feedback residual; labels must increase from call to call. An exact request sends fp32 on the wire
/// whatever comm.dtype is, without error feedback: for parameters (eager's final mean), which must reach
/// every node unrounded. (state) -> copies of the error-feedback residuals (answered after a running
/// reduce); (load, residual_map) -> true: installs them (a resume).
runtime::communicator_actor spawn_communicator(caf::actor_system& sys, communicator_options opts = {});

}  // namespace longwave::actors
