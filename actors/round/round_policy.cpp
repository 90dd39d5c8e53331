#include "actors/round/round_policy.hpp"

#include <fmt/format.h>

#include "runtime/log/log.hpp"

namespace longwave::actors {

void round_policy::fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& /*outer*/,
                                 bool boundary) const {
  if (boundary)
    for (auto& r : snap.replicas) r.steps_in_round = 0;
}

caf::error round_policy::resume_from(runtime::train_snapshot& snap) {
  if (snap.pending.defined())
    spdlog::warn(
        "the checkpoint holds the unapplied average of round {} from a delayed or eager run; this run is "
        "diloco.outer = \"{}\" and will not apply it",
        snap.pending_round, engine_.context().cfg.diloco.outer);
  return {};
}

std::string round_policy::describe(const ring_label& label) const {
  return label.second == 0 ? fmt::format("round {}", label.first)
                           : std::string("the workers' final parameters");
}

}  // namespace longwave::actors
