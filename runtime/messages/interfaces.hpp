#pragma once
// The typed actor protocol: one caf::typed_actor alias per actor, listing every message it takes and what it
// answers. A request that does not match the receiver's interface does not compile. Atoms are in
// runtime/messages/type_ids.hpp (one meaning each), payload structs in runtime/messages/messages.hpp.
#include <caf/typed_actor.hpp>

#include <string>

#include "runtime/messages/messages.hpp"
#include "runtime/messages/type_ids.hpp"

namespace longwave::runtime {

/// [eval] async's evaluator: the mean validation loss of theta over n batches (theta must not change until
/// the answer). A worker takes the same message (evaluation on the training path).
using evaluator_actor = caf::typed_actor<caf::replies_to<eval_atom, at::Tensor, int64_t>::with<double>>;

/// One model replica with its AdamW state and data stream.
using worker_actor = evaluator_actor::extend<
    /// Runs h inner steps of round, the pseudo-gradient measured from theta; reset: load theta first;
    /// fragment f >= 0: the pseudo-gradient of streaming fragment f only, packed (-1: the whole).
    caf::replies_to<run_atom, uint64_t, at::Tensor, int64_t, bool, int64_t>::with<round_result>,
    /// One inner step (sent to itself, so that control messages interleave between steps).
    caf::reacts_to<step_atom>,
    /// ddp: the gradient of one batch, then the averaged gradient applied (seconds it took).
    caf::replies_to<grad_atom>::with<round_result>, caf::replies_to<apply_atom, at::Tensor>::with<double>,
    /// Loads theta as the replica's weights.
    caf::replies_to<set_atom, at::Tensor>::with<bool>,
    /// Streaming: mixes fragment f of theta into the replica with weight alpha on the replica.
    caf::replies_to<mix_atom, at::Tensor, uint32_t, double>::with<bool>,
    /// The resumable state: cloned (of the moment asked, answered once copied; the next round may run
    /// meanwhile); lent (bool: the live buffers, between rounds only); or after running up to the given
    /// inner step (a paused replica, for a mid-round snapshot).
    caf::replies_to<state_atom>::with<replica_state>, caf::replies_to<state_atom, bool>::with<replica_state>,
    caf::replies_to<state_atom, int64_t>::with<replica_state>,
    /// To itself between rounds: answers the state asked for once its copies are done (a GPU's, in flight).
    caf::reacts_to<copied_atom>,
    /// Stops stepping (Ctrl-C); answers the inner steps done.
    caf::replies_to<pause_atom>::with<int64_t>,
    /// Installs a resumable state.
    caf::replies_to<load_atom, replica_state>::with<bool>>;

/// Owns theta_global and the outer momentum (and eager's per-replica outer state).
using outer_actor = caf::typed_actor<
    caf::replies_to<theta_atom>::with<at::Tensor>,
    /// true: a copy of theta, made on the outer optimizer's thread (an asynchronous evaluation's).
    caf::replies_to<theta_atom, bool>::with<at::Tensor>,
    /// Each of n local replicas' starting theta: eager's own outer parameters, or theta n times.
    caf::replies_to<replicas_atom, int64_t>::with<std::vector<at::Tensor>>,
    /// Replaces theta only (eager: the cluster's mean at the end).
    caf::replies_to<set_atom, at::Tensor>::with<bool>,
    /// Applies the average of a ring label: part 0 on the whole of theta, part j on streaming fragment j % P.
    caf::replies_to<outer_atom, ring_label, at::Tensor>::with<at::Tensor>,
    /// delayed: computes that step now, while the inner steps run; the step of the same label and average
    /// then only swaps it in (anything else drops it).
    caf::reacts_to<prepare_atom, ring_label, at::Tensor>,
    /// diloco.outer = "async": version's merge, the mean of `arrivals` contributions (Delayed Nesterov).
    caf::replies_to<merge_atom, uint64_t, at::Tensor, int64_t>::with<at::Tensor>,
    /// eager: every replica's proxy step from the previous average and its own pseudo-gradient.
    caf::replies_to<eager_atom, uint64_t, at::Tensor, std::vector<at::Tensor>>::with<eager_thetas>,
    /// The resumable state, cloned or (true) lent; installing one (empty replicas: eager's stay as they are).
    caf::replies_to<state_atom, bool>::with<outer_snapshot>,
    caf::replies_to<load_atom, outer_snapshot>::with<bool>>;

/// Averages the local workers' tensors, and in a cluster takes part in the all-reduce across nodes.
using communicator_actor =
    caf::typed_actor<caf::replies_to<reduce_atom, reduce_request>::with<reduced>,
                     /// The error-feedback residuals (copies), and installing them (a resume).
                     caf::replies_to<state_atom>::with<residual_map>,
                     caf::replies_to<load_atom, residual_map>::with<bool>>;

/// Writes snapshots off the training path; flush answers once every earlier save is on disk.
using checkpointer_actor = caf::typed_actor<caf::replies_to<save_atom, train_snapshot>::with<std::string>,
                                            caf::replies_to<flush_atom>::with<bool>>;

/// Prometheus metrics and metrics.jsonl: (kind, name, labels, value) and (record, json line).
using metrics_actor = caf::typed_actor<caf::reacts_to<gauge_atom, std::string, std::string, double>,
                                       caf::reacts_to<count_atom, std::string, std::string, double>,
                                       caf::reacts_to<observe_atom, std::string, std::string, double>,
                                       caf::reacts_to<record_atom, std::string>>;

/// The outer-round state machine. Answers the sender of start with (done, exit code, final val loss) when
/// the run ends.
using coordinator_actor = caf::typed_actor<caf::reacts_to<start_atom>, caf::reacts_to<stop_atom>,
                                           /// Stop at the next round boundary (a node leaving its cluster).
                                           caf::reacts_to<stop_atom, done_atom>,
                                           /// A cluster stop (longwave stop): hold at the boundary after
                                           /// the current round until told where to stop; answers that
                                           /// round.
                                           caf::replies_to<hold_atom>::with<uint64_t>,
                                           /// A cluster stop: stop at the boundary after this round.
                                           caf::reacts_to<stop_atom, uint64_t>,
                                           /// A pin (the members hold while a joiner fetches): hold at
                                           /// the boundary after this round instead.
                                           caf::reacts_to<hold_atom, uint64_t>,
                                           /// A pin is over: go on.
                                           caf::reacts_to<hold_atom, done_atom>,
                                           /// A worker's inner step.
                                           caf::reacts_to<report_atom, step_report>,
                                           /// To itself: the grace period after a lost ring peer ended.
                                           caf::reacts_to<lost_atom, ring_label, caf::error>,
                                           /// The master evicted this node or called the run off while no
                                           /// ring call of it is due to fail (async): fail now (main thread).
                                           caf::reacts_to<lost_atom, caf::error>,
                                           /// diloco.outer = "async": the master's merge (main thread).
                                           caf::reacts_to<merge_atom, merge_order>>;

}  // namespace longwave::runtime
