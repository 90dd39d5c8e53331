// federated.clients_per_round = K (Photon's client sampling): each round K of the M clients (global worker
// ranks), drawn from (run.seed, round) alike on every node, run H inner steps from theta_global; the others
// idle (0 steps, their data and optimizer untouched). The outer step applies the mean of the K pseudo-
// gradients: each node contributes its drawn workers' mean with their count as weight (0: none drawn here). A
// round whose drawn clients are all on nodes that are gone averages nothing: theta stays.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "actors/round/client_sampling.hpp"
#include "actors/round/round_policy.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors {

namespace {

class federated_policy final : public round_policy {
 public:
  using round_policy::round_policy;

  // A Ctrl-C waits for the round's end: the replicas are at different steps, so a mid-round snapshot could
  // not stop them at one.
  stop_rule stops() const override { return stop_rule::at_next_boundary; }
  std::optional<uint64_t> schedule_step() const override {
    return engine_.rounds_done() * static_cast<uint64_t>(engine_.context().cfg.train.inner_steps);
  }

  void begin_round() override {
    engine_.thetas([this](std::vector<at::Tensor> thetas) {
      const auto& ctx = engine_.context();
      const uint64_t round = engine_.rounds_done() + 1;
      const auto drawn =
          draw_clients(ctx.cfg.run.seed, round, ctx.data_parts(), ctx.cfg.federated.clients_per_round);
      std::vector<int64_t> steps(static_cast<size_t>(ctx.n_workers()), 0);
      for (int64_t c : drawn)
        if (c >= ctx.rank_offset && c < ctx.rank_offset + ctx.n_workers())
          steps[static_cast<size_t>(c - ctx.rank_offset)] = ctx.cfg.train.inner_steps;
      const auto here = std::count(steps.begin(), steps.end(), ctx.cfg.train.inner_steps);
      spdlog::info("round {}: {} of {} clients take part: {}{}", round, drawn.size(), ctx.data_parts(),
                   fmt::join(drawn, ", "),
                   ctx.cluster_workers > 0 ? fmt::format(" ({} on this node)", here) : std::string());
      engine_.run_workers(round, std::move(thetas), steps, /*reset=*/true,
                          [this, round, steps](round_engine::results results) {
                            if (engine_.current_phase() != phase::inner) return;  // stopped meanwhile
                            reduce(round, std::move(results), steps);
                          });
    });
  }

 private:
  void reduce(uint64_t round, round_engine::results results, const std::vector<int64_t>& steps) {
    if (!engine_.set_phase(phase::reducing)) return;
    std::vector<at::Tensor> parts;
    for (auto& r : results)
      if (steps[static_cast<size_t>(r.rank)] > 0) parts.push_back(std::move(r.delta));
    const auto contributors = static_cast<double>(parts.size());
    // A node with no drawn client still takes part in the all-reduce: an idle worker's zero pseudo-gradient,
    // of weight 0.
    if (parts.empty()) parts.push_back(std::move(results.front().delta));
    engine_.reduce_now(
        {round, 0}, std::move(parts),
        [this, round](at::Tensor avg) {
          if (!engine_.set_phase(phase::outer_step)) return;
          if (!avg.defined()) {  // every drawn client is on a node that is gone
            spdlog::warn(
                "round {}: none of the drawn clients took part (their nodes are gone, or joined and only "
                "observe this round): nothing to average, so theta_global and the outer momentum stay as "
                "they were",
                round);
            return engine_.theta([this](at::Tensor theta) { engine_.round_done(theta); });
          }
          engine_.outer_step(round, 0, std::move(avg),
                             [this](at::Tensor theta) { engine_.round_done(theta); });
        },
        contributors, /*empty_ok=*/true);
  }
};

}  // namespace

std::unique_ptr<round_policy> make_federated_policy(round_engine& engine) {
  return std::make_unique<federated_policy>(engine);
}

}  // namespace longwave::actors
