#pragma once
// The coordinator's round state machine: its phases, when each is entered, and which moves are legal. The
// coordinator moves only through set_phase (actors/coordinator.cpp), which fails the run on any other move.
#include <cstdint>

namespace longwave::actors {

/// Protocol phases of one training process. Each says when it is entered and what may follow it; stopping
/// and failed may follow every phase but done and failed.
enum class phase : uint8_t {
  /// Spawned, waiting for (start). Next: resuming (a snapshot to install) or inner (a fresh start).
  idle,
  /// Installing a resume snapshot (outer optimizer, communicator residuals, workers). Next: inner.
  resuming,
  /// Workers compute: H inner steps (DiLoCo), one segment between fragment events (streaming), or H
  /// synchronous grad/reduce/apply steps (ddp). Next: reducing (waiting for an average), outer_step (ddp's
  /// round end, a delayed/eager round with no earlier average), evaluating.
  inner,
  /// Waiting for an all-reduce: sync's own round, delayed/eager's previous round, a streaming fragment.
  /// Next: outer_step.
  reducing,
  /// The outer optimizer applies an average. Next: evaluating, saving, inner (next round or streaming
  /// segment), done.
  outer_step,
  /// A validation loss on the training path (the last round's, or every due round without [eval] async).
  /// Next: saving, inner, done.
  evaluating,
  /// A round-boundary snapshot is being taken (written off the training path). Next: inner, done.
  saving,
  /// Ctrl-C: pausing, aligning replicas and saving a snapshot, or abandoning a cancelled all-reduce.
  /// Next: done (exit 130), or failed (the snapshot could not be written: exit 3).
  stopping,
  /// The run ended (trained, or stopped with its checkpoint). Terminal.
  done,
  /// An error, a lost actor, a diverged round or unwritable checkpoints ended the run. Terminal.
  failed,
};

/// How many phases there are (an array indexed by phase).
inline constexpr size_t phase_count = static_cast<size_t>(phase::failed) + 1;

/// The phase's name, as in logs ("outer_step").
const char* to_string(phase p);

/// Whether the state machine allows from -> to.
bool allowed_transition(phase from, phase to);

/// Whether p ends the run (nothing may follow it).
inline bool is_terminal(phase p) {
  return p == phase::done || p == phase::failed;
}

}  // namespace longwave::actors
