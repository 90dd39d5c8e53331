// sync (classic DiLoCo): every worker runs H inner steps from theta_global, the round's pseudo-gradients are
// all-reduced while the workers wait, and the outer step applies the average before the next round.
// single: the same round with one replica that keeps its own weights between rounds (the baseline).
//
// Streaming with one fragment and no overlap trains the same theta, but keeps a fragment snapshot and mixes
// every sync into the replicas: sync's peak memory is 1.27x the model state, streaming's 1.36x
// (bench/memory.sh), so sync keeps its own, shorter path.
#include "actors/round/round_policy.hpp"

namespace longwave::actors {

namespace {

class sync_policy final : public round_policy {
 public:
  sync_policy(round_engine& engine, bool reset_workers) : round_policy(engine), reset_(reset_workers) {}

  void begin_round() override {
    run_inner_round(
        reset_, [this](uint64_t round, std::vector<at::Tensor> parts) { reduce(round, std::move(parts)); });
  }

 private:
  void reduce(uint64_t round, std::vector<at::Tensor> parts) {
    if (!engine_.set_phase(phase::reducing)) return;
    engine_.reduce_now({round, 0}, std::move(parts), [this, round](at::Tensor avg) {
      if (!engine_.set_phase(phase::outer_step)) return;
      engine_.outer_step(round, 0, std::move(avg), [this](at::Tensor theta) { engine_.round_done(theta); });
    });
  }

  bool reset_;
};

}  // namespace

std::unique_ptr<round_policy> make_sync_policy(round_engine& engine) {
  return std::make_unique<sync_policy>(engine, /*reset_workers=*/true);
}

std::unique_ptr<round_policy> make_single_policy(round_engine& engine) {
  return std::make_unique<sync_policy>(engine, /*reset_workers=*/false);
}

}  // namespace longwave::actors
