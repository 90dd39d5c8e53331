// async (diloco.outer = "async", issue 39): no round barrier. A node's round is one local phase: its workers
// run H inner steps from the newest version of theta, it reports the pseudo-gradient to the master
// (contribute) and starts the next phase at once from the newest version it has. The master merges what has
// arrived (cluster/merge_window.hpp) and tells every member; each merge is an all-reduce of ring label
// (version, 0) among all members, in which the merged nodes send their held pseudo-gradient (scaled by the
// age rule) weighted by their tokens, and the others zeros with weight 0. Every node then applies the same
// Delayed Nesterov step (the outer optimizer, outer_policy::dn_period), so every node holds the same theta
// per version, as the "version" records' CRCs show. The run ends at the first version that reaches
// train.rounds versions or async.tokens merged tokens; every node ends with that version's theta.
//
//   inner (phase r from version v) -> contribute(v, tokens) -> outer_step (theta of the newest version) ->
//   round tail -> inner ...      merges: on_merge -> all-reduce (version, 0) -> DN step -> version_done
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "actors/round/round_policy.hpp"
#include "models/outer_sgd.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"

namespace longwave::actors {

namespace {

class async_policy final : public round_policy {
 public:
  explicit async_policy(round_engine& engine) : round_policy(engine) {}

  void begin_round() override {
    engine_.thetas([this](std::vector<at::Tensor> thetas) {
      if (!zeros_.defined()) zeros_ = at::zeros_like(thetas[0]);
      const uint64_t v_start = version_;  // the outer actor answers in order: thetas hold version_
      const uint64_t round = engine_.rounds_done() + 1;
      const int64_t h = engine_.context().cfg.train.inner_steps;
      engine_.run_workers(round, std::move(thetas), {h}, /*reset=*/true,
                          [this, v_start, h](round_engine::results results) {
                            if (engine_.current_phase() != phase::inner) return;  // stopped meanwhile
                            std::vector<at::Tensor> parts;
                            for (auto& r : results) parts.push_back(std::move(r.delta));
                            phase_done(v_start, h, std::move(parts));
                          });
    });
  }

  void on_merge(const runtime::merge_order& order) override {
    if (!zeros_.defined()) {
      // Before the first phase's theta came (the outer optimizer answers in order, so this comes after it).
      return engine_.theta([this, order](at::Tensor theta) {
        if (!zeros_.defined()) zeros_ = at::zeros_like(theta);
        on_merge(order);
      });
    }
    const auto me = engine_.node_name();
    if (order.merged.empty()) return on_drops(order, me);
    if (final_ && order.version > *final_) return;  // the run ended at *final_: later merges are not ours
    if (order.version <= merging_) {
      spdlog::debug("async: version {} was announced again (merged up to {})", order.version, merging_);
      return;
    }
    if (order.version != merging_ + 1)
      return engine_.fail(runtime::make_error(
          errc::stale_round, fmt::format("async: the coordinator merged version {}, but this node "
                                         "holds version {}: it missed the merges between",
                                         order.version, merging_)));
    merging_ = order.version;
    const auto mine = std::find_if(order.merged.begin(), order.merged.end(),
                                   [&](const runtime::merge_entry& e) { return e.node == me; });
    int64_t tokens = 0;
    for (const auto& e : order.merged) tokens += static_cast<int64_t>(e.tokens);
    std::vector<at::Tensor> parts{zeros_};
    double weight = 0;
    int64_t staleness = -1;
    if (mine != order.merged.end() && reported_) {
      staleness = static_cast<int64_t>(order.version - 1 - reported_->v_start);
      parts = scaled(std::move(reported_->parts), staleness);
      weight = static_cast<double>(reported_->tokens);
      reported_.reset();
      report_held();
    } else if (mine != order.merged.end()) {
      spdlog::warn(
          "async: version {} names this node's contribution, which it no longer holds: it sends zeros",
          order.version);
    }
    const runtime::ring_label label{order.version, 0};
    engine_.start_reduce(label, std::move(parts), /*exact=*/false, weight);
    engine_.reduces().when(label, [this, label, tokens, staleness, n = order.merged.size()](at::Tensor avg) {
      engine_.reduces().take(label);
      engine_.outer_step(label.first, 0, std::move(avg),
                         [this, label, tokens, staleness, n](at::Tensor theta) {
                           applied(label.first, theta, tokens, static_cast<int64_t>(n), staleness);
                         });
    });
  }

  void finish_run(at::Tensor theta) override {
    if (reported_ || held_)
      spdlog::info("async: the run ended at version {}; this node's unmerged pseudo-gradient is dropped",
                   version_);
    engine_.run_trained(std::move(theta));
  }

  bool run_over(uint64_t /*rounds_done*/) const override { return final_.has_value() && version_ >= *final_; }
  /// A local phase runs to its end: its pseudo-gradient is measured from the version it started from.
  stop_rule stops() const override { return stop_rule::at_next_boundary; }
  /// Merges change theta while training goes on: snapshots are clones.
  bool lends_boundary_snapshot() const override { return false; }

  void fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& outer,
                     bool boundary) const override {
    round_policy::fill_snapshot(snap, outer, boundary);
    snap.version = outer.version;
    snap.dn_buffer = outer.dn_buffer;
  }

  caf::error resume_from(runtime::train_snapshot& snap) override {
    version_ = merging_ = snap.version;
    return round_policy::resume_from(snap);
  }

  std::string describe(const ring_label& label) const override {
    return fmt::format("version {}", label.first);
  }

 private:
  /// A pseudo-gradient ready to merge: `tokens` trained from version v_start, one part per local worker.
  struct held {
    uint64_t v_start = 0;
    int64_t tokens = 0;
    std::vector<at::Tensor> parts;
  };

  /// A local phase of h steps from version v_start is done: report it (or, while the master has not answered
  /// the last report, fold it into the one held back), then start the next phase from the newest version.
  void phase_done(uint64_t v_start, int64_t h, std::vector<at::Tensor> parts) {
    const auto& ctx = engine_.context();
    const int64_t tokens = h * ctx.inner.batch_size * ctx.spec.seq_len * ctx.n_workers();
    if (final_) {
      spdlog::info("async: the run ended at version {}: this phase's pseudo-gradient is not contributed",
                   *final_);
    } else if (!reported_) {
      reported_ = held{v_start, tokens, std::move(parts)};
      engine_.contribute(v_start, static_cast<uint64_t>(tokens));
    } else if (!held_) {
      held_ = held{v_start, tokens, std::move(parts)};
    } else {
      // Two phases ended before the master answered the first: the second holds their sum, from the older
      // start (its staleness counts from there).
      held_->tokens += tokens;
      for (size_t i = 0; i < parts.size() && i < held_->parts.size(); ++i) held_->parts[i].add_(parts[i]);
    }
    if (!engine_.set_phase(phase::outer_step)) return;
    engine_.theta([this](at::Tensor theta) { engine_.round_done(std::move(theta)); });
  }

  /// The master dropped contributions (too stale, or a node that left): this node's is discarded.
  void on_drops(const runtime::merge_order& order, const std::string& me) {
    for (const auto& d : order.dropped) {
      if (d.node != me || !reported_) continue;
      spdlog::warn("async: the coordinator dropped this node's contribution from version {} (version is {})",
                   d.v_start, order.version);
      reported_.reset();
      report_held();
    }
  }

  /// The report was answered: the phase held back (if any) is reported now.
  void report_held() {
    if (!held_ || final_) return;
    reported_ = std::move(held_);
    held_.reset();
    engine_.contribute(reported_->v_start, static_cast<uint64_t>(reported_->tokens));
  }

  /// async.age_scaling: a pseudo-gradient `staleness` versions old, scaled (CGAD) or as it is.
  std::vector<at::Tensor> scaled(std::vector<at::Tensor> parts, int64_t staleness) const {
    const auto& a = engine_.context().cfg.async;
    if (a.age_scaling != config::age_scaling_kind::cgad) return parts;
    const double k = models::cgad_scale(staleness, a.cgad_alpha, a.cgad_cutoff);
    for (auto& p : parts) p.mul_(k);
    return parts;
  }

  /// Version v's outer step is applied: theta is version v on every node.
  void applied(uint64_t v, const at::Tensor& theta, int64_t tokens, int64_t nodes, int64_t staleness) {
    version_ = v;
    merged_tokens_ += tokens;
    const auto& cfg = engine_.context().cfg;
    auto line = runtime::json_line("version");
    line.add("version", v).add("nodes", nodes).add("tokens", tokens).add("merged_tokens", merged_tokens_);
    if (staleness >= 0) line.add("own_staleness", staleness);
    engine_.version_done(v, theta, std::move(line));
    const bool by_versions = v >= static_cast<uint64_t>(cfg.train.rounds);
    const bool by_tokens = cfg.async.tokens > 0 && merged_tokens_ >= cfg.async.tokens;
    if (!final_ && (by_versions || by_tokens)) {
      final_ = v;
      spdlog::info("async: version {} is the last ({}): this node ends after its current phase", v,
                   by_versions ? fmt::format("train.rounds = {} versions", cfg.train.rounds)
                               : fmt::format("{} of async.tokens = {} tokens merged", merged_tokens_,
                                             cfg.async.tokens));
    }
  }

  uint64_t version_ = 0;  // theta's version: the last merge applied
  uint64_t merging_ = 0;  // the last merge started (its all-reduce running, or applied)
  int64_t merged_tokens_ = 0;
  std::optional<uint64_t> final_;  // the run's last version, once reached
  std::optional<held> reported_;   // sent to the master, not yet merged or dropped
  std::optional<held> held_;       // ended while reported_ waits: reported once that is answered
  at::Tensor zeros_;               // what a node not in a merge sends
};

}  // namespace

std::unique_ptr<round_policy> make_async_policy(round_engine& engine) {
  return std::make_unique<async_policy>(engine);
}

}  // namespace longwave::actors
