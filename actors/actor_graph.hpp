#pragma once
// The actors of one run: spawned once, each handed what it needs, then driven from the main thread until the
// coordinator says done (a cluster node's heartbeats, Ctrl-C).
#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <functional>
#include <memory>

#include "actors/coordinator.hpp"
#include "actors/run_context.hpp"
#include "actors/run_files.hpp"
#include "actors/training.hpp"
#include "comm/collective.hpp"

namespace longwave::actors {

/// The run's message types and scheduler: one scheduler thread on a shared queue for the light actors.
void configure_system(caf::actor_system_config& sys_cfg);

/// The running actors of one process, and the collective the main loop may cancel.
struct actor_graph {
  runtime::coordinator_actor coordinator;
  coordinator_peers peers;
  std::shared_ptr<comm::collective> collective;
  std::string ckpt_dir;                    ///< named when a second interrupt exits without its checkpoint
  std::function<std::string()> lock_lost;  ///< run_context::lock_lost
};

/// Spawns the metrics sink, communicator (opts.communicator_override, else the real one over the cluster's
/// collective), outer optimizer, checkpointer, evaluator ([eval] async) and the coordinator with its workers,
/// which resumes from start.resume.
/// From now on a write to a closed pipe fails instead of killing the process with SIGPIPE, and (unless
/// SIGPIPE was ignored already, as under a caller that chose so) run_until_done stops the run, saved, once
/// its standard output or error has lost its reader. Called before anything is logged that may meet such a
/// pipe.
void watch_closed_output();

/// While a run is set up (its data prepared, a cluster's state fetched, a checkpoint read), before the actors
/// that would save it: Ctrl-C, SIGTERM or SIGHUP ends the process at once with the stop's exit code 130,
/// saying nothing was trained yet (the default action ended it "killed by a signal", 143 for SIGTERM). An
/// ignored signal stays ignored. run_until_done takes over from these handlers without a gap; otherwise the
/// handlers before come back at the end of the scope.
class setup_signals {
 public:
  explicit setup_signals(bool enabled);
  ~setup_signals();
  setup_signals(const setup_signals&) = delete;
  setup_signals& operator=(const setup_signals&) = delete;
};

actor_graph spawn_graph(caf::actor_system& sys, std::shared_ptr<run_context> ctx, const run_paths& p,
                        const run_options& opts, cluster_link& cluster, start_point start);

/// Starts the coordinator and waits for its (done, code): heartbeats every 100 ms in a cluster, the first
/// Ctrl-C (or SIGTERM, SIGHUP) stops with a checkpoint, the second exits at once, naming the newest
/// checkpoint on disk. Then every actor is told to quit. Returns the coordinator's exit code.
int run_until_done(caf::actor_system& sys, const actor_graph& g, const run_options& opts,
                   cluster_link& cluster);

}  // namespace longwave::actors
