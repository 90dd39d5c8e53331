// async (diloco.outer = "async", issue 39): no round barrier. A node's round is one local phase: its workers
// run H inner steps from the newest version of theta, it reports the pseudo-gradient to the master
// (contribute) and starts the next phase at once from the newest version it has. The master merges what has
// arrived (cluster/merge_window.hpp) and tells every member; each merge is an all-reduce of ring label
// (version, 0) among all members, in which the merged nodes send their held pseudo-gradient (scaled by the
// age rule) weighted by their tokens, and the others zeros with comm::relay_weight. Every node
// then applies the same Delayed Nesterov step (the outer optimizer, outer_policy::dn_period), so every node
// holds the same theta per version, as the "version" records' CRCs show. The run ends at the first version
// that reaches train.rounds versions or async.tokens merged tokens; every node ends with that version's
// theta.
//
// A version applied while a phase runs is taken in between its inner steps (async.rebase_steps): the workers'
// weights move with theta, so the phase's pseudo-gradient counts from the newer version.
//
//   inner (phase r from version v; segments, rebased) -> contribute(v, tokens) -> outer_step (theta of the
//   newest version) -> round tail -> inner ...      merges: on_merge -> all-reduce (version, 0) -> DN step ->
//   version_done
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/round/round_policy.hpp"
#include "comm/reduction.hpp"
#include "models/outer_sgd.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"

namespace longwave::actors {

namespace {

class async_policy final : public round_policy {
 public:
  explicit async_policy(round_engine& engine) : round_policy(engine) {}

  void begin_round() override {
    if (resumed_) {
      resumed_ = false;
      return adopt_newest([this] { begin_round(); });
    }
    // Resumed or joined at the run's last version: no phase, this round tail is the last.
    if (final_ && engine_.rounds_done() >= over_after_)
      return engine_.theta([this](at::Tensor theta) { engine_.run_trained(std::move(theta)); });
    engine_.thetas([this](std::vector<at::Tensor> thetas) {
      if (!zeros_.defined()) zeros_ = at::zeros_like(thetas[0]);
      // The outer actor answers in order: thetas hold version_.
      phase_ = local_phase{engine_.rounds_done() + 1, version_, engine_.context().cfg.train.inner_steps, 0, 0,
                           std::move(thetas),         {}};
      phase_began_ = std::chrono::steady_clock::now();
      run_segment(/*reset=*/true);
    });
  }

  void on_merge(const runtime::merge_order& order) override {
    if (adopting_) return deferred_.push_back(order);  // taken once the resumed version is in place
    if (!zeros_.defined()) {
      // Before the first phase's theta came (the outer optimizer answers in order, so this comes after it).
      return engine_.theta([this, order](at::Tensor theta) {
        if (!zeros_.defined()) zeros_ = at::zeros_like(theta);
        on_merge(order);
      });
    }
    const auto me = engine_.node_name();
    if (order.merged.empty()) return on_drops(order, me);
    if (order.version <= merging_) {
      spdlog::debug("async: version {} was announced again (merged up to {})", order.version, merging_);
      return;
    }
    // A merge is taken once the one before it is applied here, so that every node knows then which
    // contributions that one held (a contributor lost before its all-reduce is not counted) and decides the
    // same: a merge after the last version is not taken.
    if (merging_ > version_) return deferred_.push_back(order);
    if (final_) return;
    if (order.version != merging_ + 1)
      return engine_.fail(runtime::make_error(
          errc::stale_round, fmt::format("async: the coordinator merged version {}, but this node "
                                         "holds version {}: it missed the merges between",
                                         order.version, merging_)));
    merging_ = order.version;
    const auto mine = std::find_if(order.merged.begin(), order.merged.end(),
                                   [&](const runtime::merge_entry& e) { return e.node == me; });
    merge_facts facts{0, static_cast<int64_t>(order.merged.size()), -1, 0, {}, 0};
    for (const auto& e : order.merged) facts.tokens += static_cast<int64_t>(e.tokens);
    std::vector<at::Tensor> parts{zeros_};
    double weight = comm::relay_weight;  // zeros that keep the ring above weight 0 (comm/reduction.hpp)
    if (mine != order.merged.end() && reported_) {
      facts.staleness = static_cast<int64_t>(order.version - 1 - reported_->v_start);
      facts.own_tokens = reported_->tokens;
      engine_.observe("longwave_outer_merge_staleness", static_cast<double>(facts.staleness));
      parts = scaled(std::move(reported_->parts), facts.staleness);
      weight = static_cast<double>(reported_->tokens);
      reported_.reset();
      report_held();
    } else if (mine != order.merged.end()) {
      spdlog::warn(
          "async: version {} names this node's contribution, which it no longer holds: it sends zeros",
          order.version);
    }
    const uint64_t v = order.version;
    reduce({v, 0}, std::move(parts), /*exact=*/false, weight,
           [this, v, facts, merged = order.merged](at::Tensor avg, std::vector<std::string> members) mutable {
             count_lost(facts, merged, members);
             if (!facts.lost.empty())
               spdlog::warn(
                   "async: version {} merges {} of {} contributions: {} left the ring before its all-reduce",
                   v, facts.nodes, merged.size(), fmt::join(facts.lost, ", "));
             engine_.merge_step(v, std::move(avg), facts.nodes,
                                [this, v, facts](at::Tensor theta) { applied(v, theta, facts); });
           });
  }

  void finish_run(at::Tensor theta) override {
    if (reported_ || held_)
      spdlog::info("async: the run ended at version {}; this node's unmerged pseudo-gradient is dropped",
                   version_);
    engine_.run_trained(std::move(theta));
  }

  /// The round that ends once the last version is applied (the phase running then, or the next one when the
  /// round tail runs): the run is over after it, so its tail is the last evaluation and checkpoint.
  bool run_over(uint64_t rounds_done) const override { return final_ && rounds_done >= over_after_; }
  /// A local phase runs to its end: its pseudo-gradient is measured from the version it started from.
  stop_rule stops() const override { return stop_rule::at_next_boundary; }
  bool shares_rounds() const override { return false; }
  /// Merges change theta while training goes on: snapshots are clones.
  bool lends_boundary_snapshot() const override { return false; }

  void fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& outer,
                     bool boundary) const override {
    round_policy::fill_snapshot(snap, outer, boundary);
    snap.version = outer.version;
    snap.dn_buffer = outer.dn_buffer;
    snap.dn_arrivals = outer.dn_arrivals;
    const auto at = tokens_at_.find(outer.version);
    snap.merged_tokens = at != tokens_at_.end() ? static_cast<uint64_t>(at->second) : 0;
  }

  caf::error resume_from(runtime::train_snapshot& snap) override {
    version_ = merging_ = snap.version;
    merged_tokens_ = static_cast<int64_t>(snap.merged_tokens);
    tokens_at_[version_] = merged_tokens_;
    if (!engine_.context().recovery) {
      resumed_ = true;
      return round_policy::resume_from(snap);
    }
    // A node that joined the running cluster fetched the members' version: there is nothing to adopt. Its
    // first version record names that version, with theta's CRC, which the master compares with the members'.
    spdlog::info("async: joined the running cluster at version {}", version_);
    auto line = runtime::json_line("version");
    line.add("version", version_)
        .add("merged_tokens", merged_tokens_)
        .add("resumed", true)
        .add("joined", true);
    engine_.version_done(version_, snap.theta, std::move(line));
    check_end(/*in_phase=*/false);
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

  /// The local phase in progress. Its pseudo-gradient is measured from version v_base: a worker's progress
  /// is carried[i] (made before its last load, undefined: none) plus its delta from starts[i].
  struct local_phase {
    uint64_t round = 0, v_base = 0;
    int64_t h = 0, done = 0, rebases = 0;
    std::vector<at::Tensor> starts, carried;
  };

  /// Runs the phase's next async.rebase_steps inner steps (all that are left when 0). A newer version
  /// applied meanwhile is taken in before the steps after (rebase); the phase's end reports it. The workers
  /// measure their pseudo-gradient only where it is needed: at the phase's end and before a rebase.
  void run_segment(bool reset) {
    const int64_t every = engine_.context().cfg.async.rebase_steps;
    const int64_t left = phase_.h - phase_.done;
    const int64_t steps = every > 0 ? std::min(every, left) : left;
    const bool last = steps == left;
    auto thetas = reset || last ? phase_.starts : std::vector<at::Tensor>{at::Tensor()};
    engine_.run_workers(phase_.round, std::move(thetas), {steps}, reset,
                        [this, steps, last, measured = reset || last](round_engine::results rs) {
                          if (engine_.current_phase() != phase::inner) return;  // stopped meanwhile
                          phase_.done += steps;
                          if (last) return phase_done(progress_of(rs));
                          if (version_ == phase_.v_base) return run_segment(/*reset=*/false);
                          if (measured) return rebase(progress_of(rs));
                          // A run of no steps measures the workers' progress from their starts.
                          engine_.run_workers(phase_.round, phase_.starts, {0}, /*reset=*/false,
                                              [this](round_engine::results now) {
                                                if (engine_.current_phase() != phase::inner) return;
                                                rebase(progress_of(now));
                                              });
                        });
  }

  /// Each worker's progress since the phase's base version: what it carried over its last load plus its
  /// pseudo-gradient from that load.
  std::vector<at::Tensor> progress_of(round_engine::results& rs) const {
    std::vector<at::Tensor> progress;
    for (size_t i = 0; i < rs.size(); ++i)
      progress.push_back(phase_.carried.empty() ? std::move(rs[i].delta) : phase_.carried[i] + rs[i].delta);
    return progress;
  }

  /// A newer version came mid-phase: each worker's weights move with theta, w <- w + (theta_new -
  /// theta_base), keeping its progress, so its pseudo-gradient is measured from the newer version (which
  /// holds this node's own earlier contributions) and is that much less stale when merged.
  void rebase(std::vector<at::Tensor> progress) {
    engine_.theta([this, progress = std::move(progress)](at::Tensor theta) mutable {
      if (engine_.current_phase() != phase::inner) return;
      phase_.v_base = version_;  // the outer actor answers in order: theta is version_
      phase_.starts.clear();
      for (const auto& p : progress) phase_.starts.push_back(theta - p);
      phase_.carried = std::move(progress);
      ++phase_.rebases;
      engine_.count("longwave_outer_rebases_total", 1);
      run_segment(/*reset=*/true);
    });
  }

  /// The local phase (phase_: h steps, counted from version v_base) is done: report it (or, while the master
  /// has not answered the last report, fold it into the one held back), then start the next phase from the
  /// newest version.
  void phase_done(std::vector<at::Tensor> parts) {
    const uint64_t v_start = phase_.v_base;
    const int64_t h = phase_.h;
    const auto& ctx = engine_.context();
    const int64_t tokens = h * ctx.inner.batch_size * ctx.spec.seq_len * ctx.n_workers();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_began_).count();
    // One line per phase: the node's step rate and what became of its pseudo-gradient.
    auto line = runtime::json_line("contribution");
    line.add("round", engine_.rounds_done() + 1)
        .add("v_start", v_start)
        .add("inner_steps", h)
        .add("rebases", phase_.rebases)
        .add("tokens", tokens)
        .add("seconds", seconds)
        .add("steps_per_second", seconds > 0 ? static_cast<double>(h) / seconds : 0.0)
        .add("sent", !final_ && !reported_);
    engine_.record(std::move(line));
    if (final_) {
      spdlog::info("async: the run ended at version {}: this phase's pseudo-gradient is not contributed",
                   *final_);
    } else if (!reported_) {
      reported_ = held{v_start, tokens, std::move(parts)};
      engine_.contribute(v_start, static_cast<uint64_t>(tokens));
      engine_.count("longwave_outer_contributions_total", 1);
    } else if (!held_) {
      held_ = held{v_start, tokens, std::move(parts)};
    } else {
      // More phases ended before the master answered the first: the held one becomes their token-weighted
      // mean, from the older start (its staleness counts from there), with all their tokens. Each started
      // from a version the master's answer has not moved past, so their sum would move theta by several
      // phases at once (merges wait while a node joins); the mean moves it by one, better estimated.
      const double w = static_cast<double>(tokens) / static_cast<double>(held_->tokens + tokens);
      for (size_t i = 0; i < parts.size() && i < held_->parts.size(); ++i)
        held_->parts[i].mul_(1.0 - w).add_(parts[i], w);
      held_->tokens += tokens;
    }
    if (!engine_.set_phase(phase::outer_step)) return;
    engine_.theta([this](at::Tensor theta) { engine_.round_done(std::move(theta)); });
  }

  /// The master dropped contributions (too stale, or a node that left): this node's is discarded.
  void on_drops(const runtime::merge_order& order, const std::string& me) {
    // The answer names the coordinator's version; the merges up to it came before it on the same link. One
    // past every merge this node heard of: it missed them (it resumed behind a run that went on, or ended).
    uint64_t heard = merging_;
    for (const auto& o : deferred_) heard = std::max<uint64_t>(heard, o.version);
    if (order.version > heard && !final_)
      return engine_.fail(runtime::make_error(
          errc::stale_round,
          fmt::format("async: the coordinator is at version {}, but this node holds version "
                      "{}: it missed the merges between",
                      order.version, heard)));
    // The run's last version is made (this node may not have applied it yet): no merge follows.
    const bool over = final_ || order.version >= static_cast<uint64_t>(engine_.context().cfg.train.rounds);
    for (const auto& d : order.dropped) {
      if (d.node != me || !reported_) continue;
      if (over) {  // a phase that ended as the last version came: expected
        spdlog::info(
            "async: the run ended at version {}; this node's contribution from version {} is not merged",
            order.version, d.v_start);
        reported_.reset();
        continue;
      }
      spdlog::warn("async: the coordinator dropped this node's contribution from version {} (version is {})",
                   d.v_start, order.version);
      engine_.count("longwave_outer_dropped_contributions_total", 1);
      auto line = runtime::json_line("dropped");
      line.add("v_start", d.v_start).add("version", order.version).add("tokens", d.tokens);
      engine_.record(std::move(line));
      reported_.reset();
      report_held();
    }
  }

  /// The report was answered: the phase held back (if any) is reported now.
  void report_held() {
    if (!held_ || final_) return;
    reported_ = std::exchange(held_, std::nullopt);
    engine_.contribute(reported_->v_start, static_cast<uint64_t>(reported_->tokens));
    engine_.count("longwave_outer_contributions_total", 1);
  }

  /// async.age_scaling: a pseudo-gradient `staleness` versions old, scaled (CGAD) or as it is.
  std::vector<at::Tensor> scaled(std::vector<at::Tensor> parts, int64_t staleness) const {
    const auto& a = engine_.context().cfg.async;
    if (a.age_scaling != config::age_scaling_kind::cgad) return parts;
    const double k = models::cgad_scale(staleness, a.cgad_alpha, a.cgad_cutoff);
    for (auto& p : parts) p.mul_(k);
    return parts;
  }

  /// What a merge took: the contributions and tokens the all-reduce held (as announced, less the lost), and
  /// this node's part (staleness -1: none).
  struct merge_facts {
    int64_t tokens = 0, nodes = 0, staleness = -1, own_tokens = 0;
    std::vector<std::string> lost;  ///< contributors the ring that computed the average no longer held
    int64_t lost_tokens = 0;        ///< theirs (not in `tokens`)
  };

  /// Takes out of f the merged nodes not among the members whose ring computed the average (empty: not
  /// known, none lost), and their tokens: a contributor lost before the all-reduce sent nothing, so Delayed
  /// Nesterov and the end rule count what is in the average, as every member sees the same members.
  static void count_lost(merge_facts& f, const std::vector<runtime::merge_entry>& merged,
                         const std::vector<std::string>& members) {
    if (members.empty()) return;
    for (const auto& e : merged) {
      if (std::find(members.begin(), members.end(), e.node) != members.end()) continue;
      f.lost.push_back(e.node);
      f.lost_tokens += static_cast<int64_t>(e.tokens);
    }
    f.nodes -= static_cast<int64_t>(f.lost.size());
    f.tokens -= f.lost_tokens;
  }

  /// Version v's outer step is applied: theta is version v on every node.
  void applied(uint64_t v, const at::Tensor& theta, const merge_facts& f) {
    version_ = v;
    merged_tokens_ += f.tokens;
    tokens_at_[v] = merged_tokens_;
    while (tokens_at_.size() > 64) tokens_at_.erase(tokens_at_.begin());  // snapshots ask for recent ones
    auto line = runtime::json_line("version");
    line.add("version", v).add("nodes", f.nodes).add("tokens", f.tokens).add("merged_tokens", merged_tokens_);
    if (!f.lost.empty())
      line.add("lost", fmt::format("{}", fmt::join(f.lost, ","))).add("lost_tokens", f.lost_tokens);
    if (f.staleness >= 0) line.add("own_staleness", f.staleness).add("own_tokens", f.own_tokens);
    engine_.version_done(v, theta, std::move(line));
    check_end();
    // The next merge, if it was announced while this one ran.
    for (auto& order : std::exchange(deferred_, {})) on_merge(order);
  }

  /// The run ends at the first version that reaches train.rounds versions or async.tokens merged tokens.
  bool reaches_end(uint64_t version, int64_t tokens) const {
    const auto& cfg = engine_.context().cfg;
    return version >= static_cast<uint64_t>(cfg.train.rounds) ||
           (cfg.async.tokens > 0 && tokens >= cfg.async.tokens);
  }

  /// Version version_ ended the run: the round in progress is the last (in_phase false: none, it ends now).
  void check_end(bool in_phase = true) {
    const auto& cfg = engine_.context().cfg;
    const uint64_t v = version_;
    const bool by_versions = v >= static_cast<uint64_t>(cfg.train.rounds);
    if (!final_ && reaches_end(v, merged_tokens_)) {
      final_ = v;
      over_after_ = engine_.rounds_done() + (in_phase ? 1 : 0);
      spdlog::info("async: version {} is the last ({}): this node ends {}", v,
                   by_versions ? fmt::format("train.rounds = {} versions", cfg.train.rounds)
                               : fmt::format("{} of async.tokens = {} tokens merged", merged_tokens_,
                                             cfg.async.tokens),
                   in_phase ? "after its current phase" : "now");
    }
  }

  /// After a resume every node holds its own newest checkpoint, of its own version; the cluster goes on from
  /// the newest: the nodes learn each other's versions (an exact all-reduce in which node r fills slot r),
  /// then the lowest rank holding the newest sends its theta, DN state and merged tokens to all (an exact
  /// all-reduce to which only it adds weight), so every node holds that version bit for bit.
  void adopt_newest(std::function<void()> k) {
    const auto [rank, world] = engine_.ring_rank();
    if (world <= 1) {
      check_end(/*in_phase=*/false);
      return k();
    }
    adopting_ = true;
    // Slot r: node r's version; slot world + r: 1. A node lost in the all-reduce leaves the mean to fewer
    // nodes than the welcome's `world`: the second half says how many (each present one reads 1/n).
    auto slots = at::zeros({2 * world}, at::kFloat);
    slots[rank] = static_cast<float>(version_);
    slots[world + rank] = 1.0f;
    reduce({0, 2}, {slots}, /*exact=*/true, 1.0,
           [this, rank = rank, world = world, k](at::Tensor mean, std::vector<std::string>) {
             const double n = std::round(1.0 / mean.narrow(0, world, world).max().item<double>());
             // mean[r] = v_r / n: exact integers again once scaled back and rounded.
             const auto versions = (mean.narrow(0, 0, world) * n).round().to(at::kLong);
             const int64_t source = versions.argmax().item<int64_t>();  // the first of the newest
             const auto newest = static_cast<uint64_t>(versions[source].item<int64_t>());
             engine_.outer_state([this, rank, source, newest, k](runtime::outer_snapshot o) {
               send_state(rank == source, newest, std::move(o), k);
             });
           });
  }

  /// adopt_newest's second step: [theta, m, buf, merged tokens in 16-bit parts, DN's arrivals] to all.
  void send_state(bool source, uint64_t newest, runtime::outer_snapshot o, std::function<void()> k) {
    const int64_t n = o.theta.numel();
    auto or_zeros = [&](const at::Tensor& t) { return t.defined() ? t : at::zeros_like(o.theta); };
    auto tokens = at::empty({token_parts + 1}, at::kFloat);
    for (int64_t i = 0; i < token_parts; ++i)
      tokens[i] = static_cast<float>((static_cast<uint64_t>(merged_tokens_) >> (16 * i)) & 0xffffu);
    tokens[token_parts] = static_cast<float>(o.dn_arrivals);  // below DN's period: exact
    auto payload = at::cat({o.theta, or_zeros(o.momentum), or_zeros(o.dn_buffer), tokens});
    reduce({0, 3}, {payload}, /*exact=*/true, source ? 1.0 : 0.0,
           [this, n, newest, k](at::Tensor all, std::vector<std::string>) {
             runtime::outer_snapshot got;
             got.theta = all.narrow(0, 0, n).clone();
             got.momentum = all.narrow(0, n, n).clone();
             got.dn_buffer = all.narrow(0, 2 * n, n).clone();
             got.version = newest;
             uint64_t tokens = 0;
             for (int64_t i = 0; i < token_parts; ++i)
               tokens |= static_cast<uint64_t>(std::llround(all[3 * n + i].item<double>())) << (16 * i);
             got.dn_arrivals = std::llround(all[3 * n + token_parts].item<double>());
             const auto theta = got.theta;
             engine_.load_outer(std::move(got), [this, newest, tokens, theta, k](bool) {
               spdlog::info("async: resuming at version {} (this node's checkpoint held version {})", newest,
                            version_);
               version_ = merging_ = newest;
               merged_tokens_ = static_cast<int64_t>(tokens);
               tokens_at_[newest] = merged_tokens_;
               auto line = runtime::json_line("version");
               line.add("version", newest).add("merged_tokens", merged_tokens_).add("resumed", true);
               engine_.version_done(newest, theta, std::move(line));
               check_end(/*in_phase=*/false);
               adopting_ = false;
               for (auto& order : std::exchange(deferred_, {})) on_merge(order);
               k();
             });
           });
  }

  /// The all-reduce of `label` in the background; k gets its average (exact: fp32, no error feedback) and
  /// the nodes it holds (inflight_reduces::members).
  void reduce(ring_label label, std::vector<at::Tensor> parts, bool exact, double weight,
              std::function<void(at::Tensor, std::vector<std::string>)> k) {
    engine_.start_reduce(label, std::move(parts), exact, weight);
    engine_.reduces().when(label, [this, label, k](at::Tensor avg) {
      auto members = engine_.reduces().members(label);
      engine_.reduces().take(label);
      k(std::move(avg), std::move(members));
    });
  }

  static constexpr int64_t token_parts = 4;  // 64 bits of merged tokens as four exact 16-bit floats

  uint64_t version_ = 0;                        // theta's version: the last merge applied
  uint64_t merging_ = 0;                        // the last merge started (its all-reduce running, or applied)
  int64_t merged_tokens_ = 0;                   // merged into theta (applied)
  uint64_t over_after_ = 0;                     // run_over from this round on, once final_ is set
  std::optional<uint64_t> final_;               // the run's last version, once reached
  std::optional<held> reported_;                // sent to the master, not yet merged or dropped
  std::optional<held> held_;                    // ended while reported_ waits: reported once that is answered
  at::Tensor zeros_;                            // what a node not in a merge sends
  std::map<uint64_t, int64_t> tokens_at_;       // merged tokens at each recent version (for snapshots)
  bool resumed_ = false;                        // resumed from a checkpoint: adopt the newest version first
  bool adopting_ = false;                       // adopt_newest runs: merges wait in deferred_
  std::vector<runtime::merge_order> deferred_;  // announced while adopting or while the merge before runs
  std::chrono::steady_clock::time_point phase_began_;
  local_phase phase_;
};

}  // namespace

std::unique_ptr<round_policy> make_async_policy(round_engine& engine) {
  return std::make_unique<async_policy>(engine);
}

}  // namespace longwave::actors
