#include "actors/round/round_policy.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors {

void round_policy::fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& /*outer*/,
                                 bool boundary) const {
  if (boundary)
    for (auto& r : snap.replicas) r.steps_in_round = 0;
}

bool round_policy::run_over(uint64_t rounds_done) const {
  return rounds_done >= static_cast<uint64_t>(engine_.context().cfg.train.rounds);
}

void round_policy::on_merge(const runtime::merge_order& order) {
  spdlog::warn("ignored the coordinator's merge of version {}: this run is diloco.outer = \"{}\"",
               order.version, engine_.context().cfg.diloco.outer);
}

void round_policy::warn_dropped_state(const runtime::train_snapshot& snap) const {
  const auto& cfg = engine_.context().cfg;
  const auto own_outer = std::count_if(snap.replicas.begin(), snap.replicas.end(),
                                       [](const auto& r) { return r.outer_theta.defined(); });
  if (own_outer > 0 && cfg.diloco.outer != config::outer_policy_kind::eager)
    spdlog::warn(
        "the checkpoint is from a diloco.outer = \"eager\" run: {} of its workers hold their own outer "
        "parameters and momentum; this run is diloco.outer = \"{}\", which keeps one theta_global, so it "
        "goes "
        "on from the checkpoint's theta_global (their mean) and drops theirs",
        own_outer, cfg.diloco.outer);
  if (cfg.diloco.outer == config::outer_policy_kind::streaming) return;
  const auto meta = runtime::parse_meta(snap.meta);
  if (const auto it = meta.find("outer"); it == meta.end() || it->second != "streaming") return;
  // Mid-round, the replicas go on from where they are: their steps reach this round's pseudo-gradient.
  for (const auto& r : snap.replicas)
    if (r.steps_in_round != 0) return;
  size_t differ = 0;
  for (const auto& r : snap.replicas)
    differ += r.master.defined() && r.master.sizes() == snap.theta.sizes() &&
              !at::equal(r.master.to(snap.theta.scalar_type()), snap.theta);
  if (differ == 0) return;
  spdlog::warn(
      "the checkpoint is from a diloco.outer = \"streaming\" run: {} of its {} workers hold inner steps of "
      "fragments not yet synchronized; this run is diloco.outer = \"{}\", which starts every round from "
      "theta_global, so those steps are dropped",
      differ, snap.replicas.size(), cfg.diloco.outer);
}

caf::error round_policy::resume_from(runtime::train_snapshot& snap) {
  warn_dropped_state(snap);
  if (snap.pending.defined())
    spdlog::warn(
        "the checkpoint holds the unapplied average of round {} from a delayed or eager run; this run is "
        "diloco.outer = \"{}\" and will not apply it",
        snap.pending_round, engine_.context().cfg.diloco.outer);
  return {};
}

void round_policy::run_inner_round(bool reset, std::function<void(uint64_t, std::vector<at::Tensor>)> k,
                                   std::function<void()> started) {
  engine_.thetas([this, reset, k, started](std::vector<at::Tensor> thetas) {
    const uint64_t round = engine_.rounds_done() + 1;
    if (started) started();
    engine_.run_workers(round, std::move(thetas), {engine_.context().cfg.train.inner_steps}, reset,
                        [this, round, k](round_engine::results results) {
                          if (engine_.current_phase() != phase::inner) return;  // stopped meanwhile
                          std::vector<at::Tensor> parts;
                          for (auto& r : results) parts.push_back(std::move(r.delta));
                          k(round, std::move(parts));
                        });
  });
}

std::string round_policy::describe(const ring_label& label) const {
  return label.second == 0 ? fmt::format("round {}", label.first)
                           : std::string("the workers' final parameters");
}

}  // namespace longwave::actors
