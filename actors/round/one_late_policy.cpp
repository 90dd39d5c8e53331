// delayed and eager: the outer step of round t applies the average of round t-1, whose all-reduce ran during
// round t's inner steps, so the workers never wait for the link unless it is slower than a round. eager adds
// each worker's own fresh pseudo-gradient to that average (Kale et al. 2025), so each replica keeps outer
// parameters of its own. A snapshot of round t carries t's average (applied by the next outer step).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "actors/round/round_policy.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors {

namespace {

class one_late_policy final : public round_policy {
 public:
  one_late_policy(round_engine& engine, bool eager) : round_policy(engine), eager_(eager) {}

  void begin_round() override {
    run_inner_round(
        /*reset=*/true,
        [this](uint64_t round, std::vector<at::Tensor> parts) { round_end(round, std::move(parts)); },
        [this] { prepare_step(); });
  }

  void finish_run(at::Tensor theta) override {
    const uint64_t r = engine_.rounds_done();
    if (eager_) return eager_finish(r);
    if (!engine_.reduces().known({r, 0})) return engine_.run_trained(std::move(theta));
    // The last round's average would otherwise be computed and dropped: apply it before the final
    // evaluation, so the result holds every round's work.
    spdlog::info("delayed: applying the average of the last round ({}) before the final evaluation", r);
    engine_.when_average(
        {r, 0},
        [this, r](at::Tensor avg) {
          engine_.reduces().take({r, 0});  // applied: the final snapshot must not carry it as pending
          engine_.outer_step(r, 0, std::move(avg),
                             [this](at::Tensor final_theta) { engine_.run_trained(std::move(final_theta)); });
        },
        /*final=*/true);
  }

  void fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& outer,
                     bool boundary) const override {
    round_policy::fill_snapshot(snap, outer, boundary);
    if (!eager_) return;
    for (size_t i = 0; i < snap.replicas.size() && i < outer.replicas.size(); ++i) {
      auto& r = snap.replicas[i];
      r.outer_theta = outer.replicas[i].theta;
      r.outer_momentum = outer.replicas[i].momentum;
      r.prev_delta = outer.replicas[i].prev_delta;
    }
  }

  std::optional<ring_label> pending_average(uint64_t round) const override { return ring_label{round, 0}; }
  bool lends_boundary_snapshot() const override { return false; }
  double staleness() const override { return 1.0; }  // the next round starts without this round's average

  caf::error resume_from(runtime::train_snapshot& snap) override {
    warn_dropped_state(snap);
    if (snap.pending.defined()) engine_.reduces().restore({snap.pending_round, 0}, snap.pending);
    return {};
  }

  /// eager: each replica's outer state (a checkpoint of another policy has none: start them from theta).
  std::vector<runtime::eager_outer> replica_outer_state(const runtime::train_snapshot& snap) const override {
    std::vector<runtime::eager_outer> out;
    if (!eager_) return out;
    bool missing = false;
    for (const auto& r : snap.replicas) {
      missing = missing || !r.outer_theta.defined();
      if (r.outer_theta.defined())
        out.push_back({r.outer_theta, r.outer_momentum, r.prev_delta});
      else
        out.push_back({snap.theta, snap.momentum, r.prev_delta});
    }
    if (missing)
      spdlog::warn(
          "the checkpoint has no per-worker outer state (it is not from an eager run); every worker's "
          "outer state starts from theta_global and its momentum");
    return out;
  }

 private:
  /// End of round r: start r's all-reduce, then step with r-1's average (which ran during round r) and let
  /// the workers continue at once. Round 1 (or a resume without a pending average) has none.
  void round_end(uint64_t r, std::vector<at::Tensor> parts) {
    const ring_label prev{r - 1, 0};
    const bool have_previous = r > 1 && engine_.reduces().known(prev);
    engine_.start_reduce({r, 0}, parts);
    if (!have_previous) {
      spdlog::info("{}: round {} has no earlier average to apply{}", engine_.context().cfg.diloco.outer, r,
                   eager_ ? " (each worker steps with its own pseudo-gradient / M)" : "");
      return step(r, at::Tensor(), std::move(parts));
    }
    if (!engine_.set_phase(phase::reducing)) return;
    engine_.when_average(prev, [this, r, prev, parts](at::Tensor avg) {
      if (engine_.current_phase() != phase::reducing) return;  // stopped meanwhile
      engine_.reduces().take(prev);
      step(r, std::move(avg), parts);
    });
  }

  /// delayed: the step this round's end applies (the previous round's average) is computed once that average
  /// comes, after this round's theta came (the outer optimizer's answer is not held up): the boundary then
  /// only swaps it in.
  void prepare_step() {
    const uint64_t prev = engine_.rounds_done();
    if (eager_ || prev == 0 || !engine_.reduces().known({prev, 0})) return;
    engine_.reduces().when(
        {prev, 0}, [this, prev](at::Tensor avg) { engine_.prepare_outer_step(prev, std::move(avg)); });
  }

  /// The outer step of round r: delayed applies the average of r-1; eager steps each replica's proxy from
  /// it and the replica's fresh pseudo-gradient. avg_prev is undefined when there is no earlier average.
  void step(uint64_t r, at::Tensor avg_prev, std::vector<at::Tensor> deltas) {
    if (!engine_.set_phase(phase::outer_step)) return;
    auto done = [this](at::Tensor theta) { engine_.round_done(std::move(theta)); };
    if (eager_)
      return engine_.eager_step(r, std::move(avg_prev), std::move(deltas),
                                [done](runtime::eager_thetas out) { done(std::move(out.theta)); });
    if (!avg_prev.defined()) return engine_.theta(done);
    engine_.outer_step(r - 1, 0, std::move(avg_prev), done);
  }

  /// eager, after the last round: the last average is applied through one more eager step with no fresh
  /// pseudo-gradient (proxy avg - delta_m / M: the rest of round T's work), then the final parameters are
  /// the mean of every worker's outer parameters (one more all-reduce, ring label (T, 1)).
  void eager_finish(uint64_t r) {
    spdlog::info("eager: applying the rest of the last round's ({}) average before the final evaluation", r);
    engine_.when_average(
        {r, 0},
        [this, r](at::Tensor avg) {
          engine_.reduces().take({r, 0});
          const std::vector<at::Tensor> none(static_cast<size_t>(engine_.context().n_workers()),
                                             at::zeros_like(avg));
          engine_.eager_step(r + 1, avg, none, [this, r](runtime::eager_thetas out) {
            // Ring label (r, 1): after the round's own (r, 0), before anything of a later round. Parameters
            // go in fp32 on the wire.
            engine_.start_reduce({r, 1}, std::move(out.replicas), /*exact=*/true);
            engine_.when_average(
                {r, 1}, [this, r](at::Tensor mean) { final_mean(r, std::move(mean)); },
                /*final=*/true);
          });
        },
        /*final=*/true);
  }

  void final_mean(uint64_t r, at::Tensor mean) {
    engine_.reduces().take({r, 1});
    spdlog::info("eager: final parameters = the mean of all {} workers' outer parameters",
                 engine_.context().global_workers());
    engine_.set_theta(mean, [this, mean](bool) { engine_.run_trained(mean); });
  }

  bool eager_;
};

}  // namespace

std::unique_ptr<round_policy> make_one_late_policy(round_engine& engine, bool eager) {
  return std::make_unique<one_late_policy>(engine, eager);
}

}  // namespace longwave::actors
