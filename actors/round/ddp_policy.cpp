// ddp (the data-parallel baseline): a round is H synchronous steps, each a gradient per worker, one
// all-reduce and the same update on every replica. theta_global is the replicas' (identical) weights,
// mirrored into the outer optimizer at the end of each round for evaluation and checkpoints.
#include "actors/round/round_policy.hpp"

namespace longwave::actors {

namespace {

class ddp_policy final : public round_policy {
 public:
  using round_policy::round_policy;

  void begin_round() override { step(); }

  stop_rule stops() const override { return stop_rule::at_next_boundary; }

  void fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& /*outer*/,
                     bool boundary) const override {
    for (auto& r : snap.replicas) r.steps_in_round = boundary ? 0 : step_in_round_;
  }

  caf::error resume_from(runtime::train_snapshot& snap) override {
    step_in_round_ = snap.replicas[0].steps_in_round;
    return round_policy::resume_from(snap);
  }

 private:
  void step() {
    if (engine_.stop_requested()) return engine_.stop_now(/*boundary=*/false);
    if (step_in_round_ >= engine_.context().cfg.train.inner_steps) return finish_round();
    engine_.gradients([this](round_engine::results grads) {
      const auto& ctx = engine_.context();
      std::vector<at::Tensor> parts;
      std::vector<runtime::step_report> reports;
      for (auto& g : grads) {
        reports.push_back({g.rank, 0, g.mean_loss, g.compute_s, ctx.inner.batch_size * ctx.spec.seq_len});
        parts.push_back(std::move(g.delta));
      }
      const int64_t at =
          static_cast<int64_t>(engine_.rounds_done()) * ctx.cfg.train.inner_steps + step_in_round_ + 1;
      engine_.reduce_gradients(
          static_cast<uint64_t>(at), std::move(parts), [this, reports, at](at::Tensor avg) {
            engine_.apply_gradient(std::move(avg), [this, reports, at](std::vector<double> apply_s) {
              ++step_in_round_;
              for (size_t i = 0; i < reports.size(); ++i) {
                auto r = reports[i];
                r.step = at;
                r.compute_s += apply_s[i];
                engine_.report(r);
              }
              step();
            });
          });
    });
  }

  /// Lent, not cloned: the worker does nothing until the outer optimizer has copied its weights and the
  /// next round starts.
  void finish_round() {
    engine_.lend_replica([this](runtime::replica_state r) {
      engine_.mirror_theta(r.master, [this, r](bool) {
        step_in_round_ = 0;
        if (!engine_.set_phase(phase::outer_step)) return;
        engine_.round_done(r.master);
      });
    });
  }

  int64_t step_in_round_ = 0;  ///< steps of the current round done
};

}  // namespace

std::unique_ptr<round_policy> make_ddp_policy(round_engine& engine) {
  return std::make_unique<ddp_policy>(engine);
}

}  // namespace longwave::actors
