#pragma once
// The communicator actor: averages pseudo-gradients (or, in ddp mode, gradients), hierarchically: first the
// local workers' tensors in process (fp32, rank order), then the node's reduction (comm/reduction.hpp, picked
// once from comm.dtype) across nodes through the collective (comm.backend: the ring or NCCL), weighted by
// the node's worker count, so every node gets the mean over all workers. One process is one node.
#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/reduction.hpp"
#include "comm/ring_allreduce.hpp"
#include "models/host_stage.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// What the communicator needs beyond the local mean.
struct communicator_options {
  /// The all-reduce across nodes (comm/collective.hpp: the ring or NCCL); null when this process is the whole
  /// run: it is then one node, on a ring of one rank that rounds as a node's ring would (`local`'s chunks).
  std::shared_ptr<comm::collective> collective;
  comm::ring_options local{};
  /// comm.dtype and the settings of its reduction (comm/reduction.hpp), the same on every node.
  comm::reduction_options reduction{};
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
  /// The workers' parts stay where they are (one GPU: run_context::mean_on_device): their mean is taken
  /// there and one copy leaves it through a host stage (pinned buffers, a side stream). Device parts are
  /// always averaged so; host parts of pseudo-gradients only when set (tests run the GPU's logic so).
  bool stage_mean = false;
};

/// stage_mean's local mean: the parts' mean where they are (in rank order, as on the host), then one copy
/// into a reusable host buffer of `stage` (made for the parts' device when it is not), which the caller may
/// write. The parts are let go once the copy is done, and with it the mean that read them: only then may a
/// worker write its buffer again.
at::Tensor staged_mean(std::unique_ptr<models::host_stage>& stage, std::vector<at::Tensor> parts);

/// Messages: runtime::communicator_actor. (reduce, request) -> the mean of request.parts. The local sum is in
/// rank order in fp32 (deterministic, independent of arrival order); the ring result is bit-identical on
/// every node. Non-finite values fail the round before anything is sent. Each ring label part has its own
/// error-feedback residual; labels must increase from call to call. An exact request sends fp32 on the wire
/// whatever comm.dtype is, without error feedback: for parameters (eager's final mean), which must reach
/// every node unrounded. (state) -> copies of the error-feedback residuals (answered after a running
/// reduce); (load, residual_map) -> true: installs them (a resume).
runtime::communicator_actor spawn_communicator(caf::actor_system& sys, communicator_options opts = {});

}  // namespace longwave::actors
