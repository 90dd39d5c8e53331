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
#include "comm/collective.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// The coordinator's collaborators.
struct coordinator_peers {
  runtime::communicator_actor communicator;
  runtime::outer_actor outer;
  runtime::checkpointer_actor checkpointer;
  runtime::metrics_actor metrics;
  runtime::evaluator_actor evaluator;  ///< [eval] async: evaluations off the training path; null: worker 0
  /// The cluster's collective (null alone): diloco.adaptive_steps sets this node's note on it (workers, step
  /// time) and reads every node's from it.
  std::shared_ptr<comm::collective> collective;
  /// Tests only: spawns worker `rank` (reporting to `coordinator`) instead of spawn_worker, e.g. a fake that
  /// answers (run, ...) with a set pseudo-gradient. Empty: the real worker.
  std::function<runtime::worker_actor(caf::actor_system&, int64_t rank,
                                      runtime::coordinator_actor coordinator)>
      worker_factory;
};

/// Spawns the coordinator and its workers. `resume` is installed before the first round.
/// Messages: (start) from the main thread; the coordinator answers that sender with
/// (done, exit_code, final_val_loss) when training ends, fails or was stopped by (stop).
/// The loss trace (one line per inner step: step, round, mean loss) goes to trace_path.
runtime::coordinator_actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const run_context> ctx,
                                             coordinator_peers peers,
                                             std::optional<runtime::train_snapshot> resume,
                                             std::string trace_path);

}  // namespace longwave::actors
