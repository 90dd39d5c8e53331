#pragma once
// The coordinator actor: owns the outer-round state machine (see ARCHITECTURE.md) and drives workers,
// communicator, outer optimizer, checkpointer and metrics sink by message.
#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/round/phase.hpp"
#include "actors/run_context.hpp"
#include "runtime/messages/messages.hpp"

namespace longwave::actors {

/// The coordinator's collaborators.
struct coordinator_peers {
  caf::actor communicator, outer, checkpointer, metrics;
  caf::actor evaluator;  ///< [eval] async: evaluations off the training path; null: worker 0 evaluates
  /// Tests only: spawns worker `rank` (reporting to `coordinator`) instead of spawn_worker, e.g. a fake that
  /// answers (run, ...) with a set pseudo-gradient. Empty: the real worker.
  std::function<caf::actor(caf::actor_system&, int64_t rank, caf::actor coordinator)> worker_factory;
};

/// Spawns the coordinator and its workers. `resume` is installed before the first round.
/// Messages: (start) from the main thread; the coordinator answers that sender with
/// (done, exit_code, final_val_loss) when training ends, fails or was stopped by (stop).
/// The loss trace (one line per inner step: step, round, mean loss) goes to trace_path.
caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const run_context> ctx,
                             coordinator_peers peers, std::optional<runtime::train_snapshot> resume,
                             std::string trace_path);

}  // namespace longwave::actors
