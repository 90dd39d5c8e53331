// streaming (Streaming DiLoCo): theta is cut into P fragments. Round t's inner steps are cut into segments
// at the fragment events of streaming_schedule.hpp: for j = 1..P, fragment j mod P takes its snapshot and
// starts its all-reduce at inner step j*H/P - tau, and is synced at j*H/P (outer step on its ranges, then
// mixed into every replica). Between two events the workers run freely; a stop waits for the next event
// with no fragment in flight.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "actors/round/round_policy.hpp"
#include "actors/round/streaming_schedule.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"

namespace longwave::actors {

namespace {

class streaming_policy final : public round_policy {
 public:
  explicit streaming_policy(round_engine& engine)
      : round_policy(engine),
        shape_{engine.context().cfg.train.inner_steps, engine.context().cfg.diloco.fragments,
               engine.context().cfg.diloco.tau},
        p_(static_cast<uint32_t>(engine.context().fragments.size())) {}

  void begin_round() override { segment(); }

  /// After the last round: fragments 1..P-1 were last synced part-way through it. Their remaining work is
  /// all-reduced and applied one by one (ring labels (T, P+f)), so the final parameters hold every step.
  void finish_run(at::Tensor /*theta*/) override { final_sync(0); }

  stop_rule stops() const override { return stop_rule::at_next_boundary; }
  bool at_round_boundary() const override { return pos_ == 0; }

  void fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& /*outer*/,
                     bool boundary) const override {
    for (auto& r : snap.replicas) r.steps_in_round = boundary ? 0 : pos_;
  }

  /// Each fragment's average is applied tau inner steps after its snapshot.
  double staleness() const override {
    return static_cast<double>(shape_.tau) / static_cast<double>(shape_.h);
  }

  caf::error resume_from(runtime::train_snapshot& snap) override {
    round_policy::resume_from(snap);
    // The workers count segments themselves; the policy continues the round's schedule from here.
    pos_ = snap.replicas[0].steps_in_round;
    if (!streaming_resumable_at(shape_, pos_)) {
      const auto meta = runtime::parse_meta(snap.meta);
      const auto it = meta.find("outer");
      const bool was_streaming = it != meta.end() && it->second == "streaming";
      return runtime::make_error(
          errc::checkpoint_mismatch,  // as any checkpoint this run's settings cannot resume (exit 1)
          fmt::format("the checkpoint stopped at inner step {} of its round, {}; resume with the {} it was "
                      "written with, or start over with --fresh",
                      pos_,
                      pos_ >= shape_.h ? "after its last step but before its average: diloco.outer = "
                                         "\"streaming\" has no such point"
                                       : fmt::format("which is not a fragment sync point of diloco.outer = "
                                                     "\"streaming\" (every {} steps)",
                                                     shape_.period()),
                      was_streaming ? "train.inner_steps, diloco.fragments and diloco.tau" : "policy"));
    }
    for (auto& r : snap.replicas) r.steps_in_round = 0;
    return {};
  }

  std::string describe(const ring_label& label) const override {
    return fmt::format("round {} fragment sync {}", label.first, label.second);
  }

 private:
  /// Runs the workers up to the next event of the round (a snapshot point or a sync point), then handles it.
  void segment() {
    if (engine_.stop_requested() && !engine_.reduces().any_running())
      return engine_.stop_now(/*boundary=*/pos_ == 0);
    const auto e = next_streaming_event(shape_, pos_);
    const uint64_t round = engine_.rounds_done() + 1;
    auto run = [this, e, round](at::Tensor theta) {
      // At a snapshot point each worker hands out only the fragment's pseudo-gradient.
      engine_.run_workers(round, {theta}, {e.steps}, /*reset=*/false,
                          e.snapshot ? static_cast<int64_t>(e.fragment) : -1,
                          [this, e, round](round_engine::results rs) {
                            if (engine_.current_phase() != phase::inner) return;  // stopped meanwhile
                            pos_ = e.next_pos();
                            if (e.snapshot) reduce_fragment({round, e.j}, rs);
                            if (!e.sync) return segment();
                            sync(e.j);
                          });
    };
    if (!e.snapshot) return run(at::Tensor());  // no pseudo-gradient needed at a sync point
    engine_.theta(run);
  }

  /// Sync point j of the current round: wait for its average, step the fragment, mix it into the replicas.
  void sync(uint32_t j) {
    const uint64_t round = engine_.rounds_done() + 1;
    if (!engine_.set_phase(phase::reducing)) return;
    engine_.when_average({round, j}, [this, round, j](at::Tensor avg) {
      if (engine_.current_phase() != phase::reducing) return;
      engine_.reduces().take({round, j});
      if (!engine_.set_phase(phase::outer_step)) return;
      engine_.outer_step(round, j, std::move(avg), [this, j](at::Tensor theta) {
        engine_.mix(theta, j % p_, engine_.context().cfg.diloco.alpha, [this, j, theta](bool) {
          if (j == p_) return engine_.round_done(theta);  // the round's last event
          if (!engine_.set_phase(phase::inner)) return;
          segment();
        });
      });
    });
  }

  /// Starts the all-reduce of the workers' fragment pseudo-gradients under ring label `label`.
  void reduce_fragment(const ring_label& label, round_engine::results& results) {
    std::vector<at::Tensor> parts;
    for (auto& r : results) parts.push_back(std::move(r.delta));
    engine_.start_reduce(label, std::move(parts));
  }

  void final_sync(size_t i) {
    const auto finals = streaming_final_fragments(shape_);
    if (i >= finals.size()) return engine_.theta([this](at::Tensor theta) { engine_.run_trained(theta); });
    if (i == 0) spdlog::info("streaming: syncing fragments 1..{} once more after the last round", p_ - 1);
    const uint32_t f = finals[i];
    const uint64_t r = engine_.rounds_done();
    const ring_label label{r, p_ + f};
    engine_.theta([this, i, f, r, label](at::Tensor theta) {
      engine_.run_workers(r, {theta}, {0}, /*reset=*/false, f, [this, i, r, label](round_engine::results rs) {
        reduce_fragment(label, rs);
        engine_.when_average(
            label,
            [this, i, r, label](at::Tensor avg) {
              engine_.reduces().take(label);
              engine_.outer_step(r, label.second, std::move(avg),
                                 [this, i](at::Tensor) { final_sync(i + 1); });
            },
            /*final=*/true);
      });
    });
  }

  streaming_shape shape_;
  uint32_t p_;
  int64_t pos_ = 0;  ///< inner steps of the current round done (at a segment boundary)
};

}  // namespace

std::unique_ptr<round_policy> make_streaming_policy(round_engine& engine) {
  return std::make_unique<streaming_policy>(engine);
}

}  // namespace longwave::actors
