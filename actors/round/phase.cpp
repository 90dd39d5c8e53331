// The coordinator's transition table (the comments on each phase in phase.hpp say the same in words).
#include "actors/round/phase.hpp"

namespace longwave::actors {

const char* to_string(phase p) {
  switch (p) {
    case phase::idle: return "idle";
    case phase::resuming: return "resuming";
    case phase::inner: return "inner";
    case phase::reducing: return "reducing";
    case phase::outer_step: return "outer_step";
    case phase::evaluating: return "evaluating";
    case phase::saving: return "saving";
    case phase::stopping: return "stopping";
    case phase::done: return "done";
    case phase::failed: return "failed";
  }
  return "?";
}

bool allowed_transition(phase from, phase to) {
  if (is_terminal(from)) return false;
  if (to == phase::failed) return true;
  if (to == phase::stopping) return from != phase::stopping;
  switch (from) {
    case phase::idle: return to == phase::resuming || to == phase::inner;
    case phase::resuming: return to == phase::inner;
    case phase::inner: return to == phase::reducing || to == phase::outer_step || to == phase::evaluating;
    case phase::reducing: return to == phase::outer_step;
    case phase::outer_step:
      return to == phase::evaluating || to == phase::saving || to == phase::inner || to == phase::done;
    case phase::evaluating: return to == phase::saving || to == phase::inner || to == phase::done;
    case phase::saving: return to == phase::inner || to == phase::evaluating || to == phase::done;
    case phase::stopping: return to == phase::done;
    case phase::done:
    case phase::failed: return false;
  }
  return false;
}

}  // namespace longwave::actors
