#pragma once
// The checkpointer actor: receives snapshots by message and writes them off the training path (detached
// thread), atomically and checksummed, keeping the last K.
#include <caf/actor.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// Messages: (save, train_snapshot) -> path; (flush) -> true once every earlier save is on disk.
/// With a metrics sink, each write reports its seconds, bytes and time (and a "checkpoint" line of
/// metrics.jsonl); a failed write counts longwave_errors_total{reason="checkpoint_write"}. `lock_lost`
/// (run_context::lock_lost), when set, is asked before each write: a lost lock answers errc::dir_lost and
/// nothing is written. A write still running after a minute is said in the log, once a minute. `resumed_from`
/// (the run's start checkpoint, "" if none) is not pruned before a write lands (checkpoint_store::stand_on).
runtime::checkpointer_actor spawn_checkpointer(caf::actor_system& sys, std::string dir, int64_t keep,
                                               runtime::snapshot_shape shape,
                                               runtime::metrics_actor metrics = {},
                                               std::function<std::string()> lock_lost = {},
                                               std::string resumed_from = {});

}  // namespace longwave::actors
