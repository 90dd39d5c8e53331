// Each round policy alone, against a fake round_engine that answers at once and writes down every call: the
// policies need nothing of the coordinator, so a new policy can be tested the same way before it is wired.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/round/client_sampling.hpp"
#include "actors/round/round_policy.hpp"
#include "models/outer_sgd.hpp"
#include "runtime/errors/errors.hpp"

using namespace longwave;
using namespace longwave::actors;
using runtime::ring_label;

namespace {

std::string label_text(const ring_label& l) {
  return "(" + std::to_string(l.first) + "," + std::to_string(l.second) + ")";
}

/// Answers every call at once. Worker m's pseudo-gradient is 0.1 (m + 1) everywhere; an all-reduce's average
/// is the mean of its parts; the outer step is theta -= avg on the label's fragment (lr 1, no momentum).
/// Background all-reduces finish at once, or on a slow link when the test says so (finish_reduces).
struct fake_engine final : round_engine {
  run_context ctx;
  std::vector<std::string> calls;
  inflight_reduces inflight;
  std::deque<std::pair<ring_label, at::Tensor>> running;  // started, not yet finished
  uint64_t done = 0;
  bool stop = false;
  phase ph = phase::idle;
  at::Tensor global = at::zeros({4});
  at::Tensor trained;                // the final theta, once run_trained was called
  std::set<uint64_t> nobody_rounds;  // client sampling: rounds whose drawn clients are all on nodes gone
  bool round_ended = false;
  bool slow_link = false;
  std::vector<std::string> members;  // the nodes each finished all-reduce says it averaged (empty: unknown)

  explicit fake_engine(config::train_config cfg) {
    ctx.cfg = std::move(cfg);
    ctx.fragments = {{{0, 2}}, {{2, 2}}};  // two fragments of a 4-value theta
  }

  void note(std::string s) { calls.push_back(std::move(s)); }
  at::Tensor mean(const std::vector<at::Tensor>& parts) { return at::stack(parts).mean(0); }
  void finish_reduces() {
    while (!running.empty()) {
      auto [label, avg] = running.front();
      running.pop_front();
      inflight.arrived(label, avg, members);
    }
  }

  const run_context& context() const override { return ctx; }
  uint64_t rounds_done() const override { return done; }
  bool stop_requested() const override { return stop; }
  phase current_phase() const override { return ph; }
  bool set_phase(phase to) override {
    if (!allowed_transition(ph, to)) {
      note(std::string("illegal ") + to_string(ph) + " -> " + to_string(to));
      return false;
    }
    ph = to;
    return true;
  }
  void fail(const caf::error&) override { note("fail"); }
  void stop_now(bool boundary) override { note(boundary ? "stop boundary" : "stop mid-round"); }
  void round_done(at::Tensor theta) override {
    note("round_done");
    global = theta;
    ++done;
    round_ended = true;
  }
  void run_trained(at::Tensor theta) override {
    note("trained");
    trained = theta;
  }

  /// "run R xH", or with counts per worker "run R x[H,0,...]"; a worker that runs 0 steps returns 0.
  using round_engine::run_workers;
  void run_workers(uint64_t round, std::vector<at::Tensor> thetas, std::vector<int64_t> steps, bool reset,
                   int64_t fragment, then<results> k) override {
    std::string counts = std::to_string(steps[0]);
    if (steps.size() > 1) {
      counts = "[";
      for (size_t i = 0; i < steps.size(); ++i) counts += (i ? "," : "") + std::to_string(steps[i]);
      counts += "]";
    }
    note("run " + std::to_string(round) + " x" + counts + (reset ? " reset" : "") +
         (thetas.size() == 1 && !thetas[0].defined() ? " no-theta" : "") +
         (fragment >= 0 ? " fragment " + std::to_string(fragment) : ""));
    results rs;
    for (int64_t m = 0; m < ctx.n_workers(); ++m) {
      const bool idle = steps.size() > 1 && steps[static_cast<size_t>(m)] == 0;
      auto delta = at::full({4}, idle ? 0.0f : 0.1f * static_cast<float>(m + 1));
      if (fragment >= 0) {  // a fragment's values only, as a worker packs them
        const auto& [off, len] = ctx.fragments[static_cast<size_t>(fragment)][0];
        delta = delta.narrow(0, off, len).clone();
      }
      rs.push_back({m, round, delta, 3.0, 0.01});
    }
    run_thetas = thetas;
    if (hold_runs) {
      held_run = [k = std::move(k), rs = std::move(rs)]() mutable { k(std::move(rs)); };
      return;
    }
    k(std::move(rs));
  }
  /// hold_runs: the workers' answer waits for release_run(), so a test can act while they train.
  bool hold_runs = false;
  std::function<void()> held_run;
  std::vector<at::Tensor> run_thetas;  // the last run's thetas
  void release_run() {
    CATCH_REQUIRE(held_run);
    auto k = std::exchange(held_run, nullptr);
    k();
  }
  void mix(at::Tensor, uint32_t fragment, double, then<bool> k) override {
    note("mix " + std::to_string(fragment));
    k(true);
  }
  void gradients(then<results> k) override {
    note("grad");
    run_workers(done + 1, {at::Tensor()}, {0}, false, [this, k](results rs) {
      calls.pop_back();  // the helper's own "run" line
      k(std::move(rs));
    });
  }
  void apply_gradient(at::Tensor, then<std::vector<double>> k) override {
    note("apply");
    k(std::vector<double>(static_cast<size_t>(ctx.n_workers()), 0.0));
  }
  void lend_replica(then<runtime::replica_state> k) override {
    note("lend");
    runtime::replica_state r;
    r.master = at::full({4}, 7.0f);
    k(r);
  }
  void report(const runtime::step_report& r) override {
    note("report " + std::to_string(r.rank) + "@" + std::to_string(r.step));
  }
  void theta(then<at::Tensor> k) override {
    note("theta");
    k(global);
  }
  void thetas(then<std::vector<at::Tensor>> k) override {
    note("thetas");
    k(std::vector<at::Tensor>(static_cast<size_t>(ctx.n_workers()), global));
  }
  void set_theta(at::Tensor theta, then<bool> k) override {
    note("set_theta");
    global = theta;
    k(true);
  }
  void mirror_theta(at::Tensor weights, then<bool> k) override {
    note("mirror");
    global = weights;
    k(true);
  }
  void merge_step(uint64_t version, at::Tensor avg, int64_t arrivals, then<at::Tensor> k) override {
    note("merge " + std::to_string(version) + " of " + std::to_string(arrivals));
    global = global - avg;
    k(global);
  }
  void outer_step(uint64_t round, uint32_t fragment, at::Tensor avg, then<at::Tensor> k) override {
    note("outer " + label_text({round, fragment}));
    if (fragment == 0) {
      global = global - avg;
    } else {
      const auto& [off, len] = ctx.fragments[fragment % ctx.fragments.size()][0];
      global = global.clone();
      global.narrow(0, off, len).sub_(avg);
    }
    k(global);
  }
  void prepare_outer_step(uint64_t round, at::Tensor /*avg*/) override {
    note("prepare " + label_text({round, 0}));
  }
  void eager_step(uint64_t round, at::Tensor avg_prev, std::vector<at::Tensor> deltas,
                  then<runtime::eager_thetas> k) override {
    note("eager " + std::to_string(round) + (avg_prev.defined() ? " with-avg" : " no-avg"));
    runtime::eager_thetas out;
    for (auto& d : deltas) out.replicas.push_back(global - d);
    out.theta = mean(out.replicas);
    global = out.theta;
    k(out);
  }
  void reduce_now(ring_label label, std::vector<at::Tensor> parts, then<at::Tensor> k, double weight,
                  bool empty_ok) override {
    note("reduce_now " + label_text(label) +
         (weight >= 0 ? " of " + std::to_string(static_cast<int64_t>(weight)) : std::string()));
    if (empty_ok && nobody_rounds.count(label.first)) return k(at::Tensor());
    k(mean(parts));
  }
  void reduce_gradients(uint64_t step, std::vector<at::Tensor> parts, then<at::Tensor> k) override {
    note("reduce_gradients " + std::to_string(step));
    k(mean(parts));
  }
  void start_reduce(ring_label label, std::vector<at::Tensor> parts, bool exact, double weight) override {
    note("start_reduce " + label_text(label) + (exact ? " exact" : "") +
         (weight >= 0 ? " of " + std::to_string(weight) : std::string()));
    inflight.started(label);
    running.emplace_back(label, mean(parts));
    if (!slow_link) finish_reduces();
  }
  void when_average(ring_label label, then<at::Tensor> k, bool final) override {
    note("when_average " + label_text(label) + (final ? " final" : ""));
    if (final) finish_reduces();  // nothing computes any more: let the ring finish
    inflight.when(label, std::move(k));
  }
  inflight_reduces& reduces() override { return inflight; }

  std::string name = "a";
  std::vector<std::pair<uint64_t, uint64_t>> contributions;  // (v_start, tokens)
  std::vector<uint64_t> versions;
  std::string node_name() const override { return name; }
  std::pair<int64_t, int64_t> rank{0, 1};  // this node's rank at the welcome, and the welcome's ring size
  std::pair<int64_t, int64_t> ring_rank() const override { return rank; }
  void outer_state(then<runtime::outer_snapshot> k) override {
    note("outer_state");
    k(runtime::outer_snapshot{
        global.clone(), at::Tensor(), {}, versions.empty() ? 0 : versions.back(), {}, 0});
  }
  void load_outer(runtime::outer_snapshot state, then<bool> k) override {
    note("load_outer");
    global = state.theta;
    k(true);
  }
  void contribute(uint64_t v_start, uint64_t tokens) override {
    note("contribute " + std::to_string(v_start));
    contributions.emplace_back(v_start, tokens);
  }
  std::vector<std::string> version_lines;
  void version_done(uint64_t version, const at::Tensor&, runtime::json_line line) override {
    note("version " + std::to_string(version));
    versions.push_back(version);
    version_lines.push_back(line.str());
  }
  std::vector<std::string> records;  // metrics.jsonl lines
  std::map<std::string, double> metrics;
  void record(runtime::json_line line) override { records.push_back(line.str()); }
  void observe(const char* name, double value) override { metrics[name] += value; }
  void count(const char* name, double value) override { metrics[name] += value; }
};

config::train_config two_workers(config::run_mode mode, config::outer_policy_kind outer, int64_t rounds) {
  config::train_config cfg;
  cfg.run.mode = mode;
  cfg.diloco.outer = outer;
  cfg.train.workers = 2;
  cfg.train.inner_steps = 4;
  cfg.train.rounds = rounds;
  cfg.diloco.fragments = 2;
  cfg.diloco.tau = 1;
  return cfg;
}

/// Runs every round as the coordinator would (phase inner, begin_round), then finish_run.
void run_all(fake_engine& e, round_policy& p) {
  const auto rounds = static_cast<uint64_t>(e.ctx.cfg.train.rounds);
  while (e.done < rounds) {
    e.ph = phase::idle;
    CATCH_REQUIRE(e.set_phase(phase::inner));
    e.round_ended = false;
    e.note("-- round " + std::to_string(e.done + 1));
    p.begin_round();
    CATCH_REQUIRE(e.round_ended);
  }
  e.note("-- finish");
  p.finish_run(e.global);
}

std::vector<std::string> lines_of(const fake_engine& e, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& c : e.calls)
    if (c.rfind(prefix, 0) == 0) out.push_back(c);
  return out;
}

/// Client sampling: 2 of 4 workers drawn a round, 3 rounds, run.seed 5.
config::train_config sampling_config() {
  auto cfg = two_workers(config::run_mode::diloco, config::outer_policy_kind::sync, 3);
  cfg.train.workers = 4;
  cfg.federated.clients_per_round = 2;
  cfg.run.seed = 5;
  return cfg;
}

}  // namespace

CATCH_TEST_CASE("sync all-reduces each round while the workers wait and steps theta by the mean",
                "[unit][round]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::sync, 2));
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  const std::vector<std::string> expected{
      "-- round 1",  "thetas",     "run 1 x4 reset", "reduce_now (1,0)", "outer (1,0)",
      "round_done",  "-- round 2", "thetas",         "run 2 x4 reset",   "reduce_now (2,0)",
      "outer (2,0)", "round_done", "-- finish",      "trained"};
  CATCH_CHECK(e.calls == expected);
  CATCH_CHECK(at::allclose(e.trained, at::full({4}, -0.3f)));  // two rounds of mean 0.15
  CATCH_CHECK(p->stops() == stop_rule::pause_and_align);
  CATCH_CHECK(p->lends_boundary_snapshot());
  CATCH_CHECK(!p->pending_average(1));
  CATCH_CHECK(p->staleness() == 0);
}

CATCH_TEST_CASE("client sampling runs only the drawn workers and averages their pseudo-gradients",
                "[unit][round][federated]") {
  fake_engine e(sampling_config());
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  const auto runs = lines_of(e, "run ");
  const auto reduces = lines_of(e, "reduce_now");
  CATCH_REQUIRE(runs.size() == 3);
  at::Tensor want = at::zeros({4});
  for (uint64_t r = 1; r <= 3; ++r) {
    const auto drawn = draw_clients(5, r, 4, 2);
    CATCH_REQUIRE(drawn.size() == 2);
    std::string counts = "[";
    for (int64_t m = 0; m < 4; ++m)
      counts += std::string(m ? "," : "") + (std::count(drawn.begin(), drawn.end(), m) ? "4" : "0");
    CATCH_CHECK(runs[r - 1] == "run " + std::to_string(r) + " x" + counts + "]" + " reset");
    CATCH_CHECK(reduces[r - 1] == "reduce_now (" + std::to_string(r) + ",0) of 2");
    want -= 0.1f * static_cast<float>(drawn[0] + 1 + drawn[1] + 1) / 2;  // the drawn workers' mean only
  }
  CATCH_CHECK(at::allclose(e.trained, want));
}

CATCH_TEST_CASE("client sampling: a round whose drawn clients are all on nodes gone leaves theta as it was",
                "[unit][round][federated]") {
  // It failed the all-reduce ("every rank contributed weight 0"), which the cluster retried as a ring failure
  // until it called the run off.
  fake_engine e(sampling_config());
  e.nobody_rounds = {2};
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  CATCH_CHECK(lines_of(e, "outer").size() == 2);
  CATCH_CHECK(lines_of(e, "outer (2,0)").empty());
  CATCH_CHECK(lines_of(e, "round_done").size() == 3);
  at::Tensor want = at::zeros({4});
  for (uint64_t r : {1, 3}) {
    const auto drawn = draw_clients(5, r, 4, 2);
    want -= 0.1f * static_cast<float>(drawn[0] + 1 + drawn[1] + 1) / 2;
  }
  CATCH_CHECK(at::allclose(e.trained, want));
}

CATCH_TEST_CASE("The client draw is seeded, distinct, and fair over many rounds",
                "[unit][round][federated]") {
  CATCH_CHECK(draw_clients(1, 7, 8, 3) == draw_clients(1, 7, 8, 3));
  CATCH_CHECK(draw_clients(1, 7, 8, 0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CATCH_CHECK(draw_clients(1, 7, 3, 5) == std::vector<int64_t>{0, 1, 2});
  std::vector<int> seen(8, 0);
  int differ_by_seed = 0, differ_by_round = 0;
  for (uint64_t r = 1; r <= 4000; ++r) {
    const auto d = draw_clients(1, r, 8, 3);
    CATCH_REQUIRE(d.size() == 3);
    CATCH_REQUIRE(std::is_sorted(d.begin(), d.end()));
    CATCH_REQUIRE(std::adjacent_find(d.begin(), d.end()) == d.end());
    for (auto c : d) ++seen[static_cast<size_t>(c)];
    differ_by_seed += d != draw_clients(2, r, 8, 3);
    differ_by_round += d != draw_clients(1, r + 1, 8, 3);
  }
  for (int n : seen) CATCH_CHECK(std::abs(n - 1500) < 150);  // 4000 x 3/8 each, about 3.5 sigma
  CATCH_CHECK(differ_by_seed > 3000);
  CATCH_CHECK(differ_by_round > 3000);
}

CATCH_TEST_CASE("single runs the sync round with a replica that keeps its own weights", "[unit][round]") {
  auto cfg = two_workers(config::run_mode::single, config::outer_policy_kind::sync, 1);
  cfg.train.workers = 1;
  fake_engine e(cfg);
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  CATCH_CHECK(lines_of(e, "run") == std::vector<std::string>{"run 1 x4"});
}

CATCH_TEST_CASE(
    "delayed applies round t-1's average at the end of round t and the last one before the end, each step "
    "prepared as its round starts",
    "[unit][round]") {
  // The fake's all-reduces end at once: the step a round's end applies is prepared as the round starts, once
  // its theta came; the last round's is applied in finish_run, unprepared.
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::delayed, 3));
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  const std::vector<std::string> expected{
      // round 1
      "-- round 1", "thetas", "run 1 x4 reset", "start_reduce (1,0)", "theta", "round_done",
      // round 2: its step (round 1's average) prepared once its theta came
      "-- round 2", "thetas", "prepare (1,0)", "run 2 x4 reset", "start_reduce (2,0)", "when_average (1,0)",
      "outer (1,0)", "round_done",
      // round 3
      "-- round 3", "thetas", "prepare (2,0)", "run 3 x4 reset", "start_reduce (3,0)", "when_average (2,0)",
      "outer (2,0)", "round_done",
      // the last average, applied after the last round
      "-- finish", "when_average (3,0) final", "outer (3,0)", "trained"};
  CATCH_CHECK(e.calls == expected);
  CATCH_CHECK(at::allclose(e.trained, at::full({4}, -0.45f)));  // every round's average applied once
  CATCH_CHECK(p->pending_average(2) == ring_label{2, 0});
  CATCH_CHECK(!p->lends_boundary_snapshot());
  CATCH_CHECK(p->staleness() == 1);
  CATCH_CHECK(!e.inflight.has_average({3, 0}));  // taken: a final snapshot does not carry it as pending
}

CATCH_TEST_CASE("delayed waits in reducing for an average that is late, and not for one that came",
                "[unit][round]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::delayed, 2));
  e.slow_link = true;
  auto p = make_round_policy(e, e.ctx);
  e.ph = phase::inner;
  p->begin_round();  // round 1: no earlier average
  CATCH_REQUIRE(e.done == 1);
  e.ph = phase::idle;
  CATCH_REQUIRE(e.set_phase(phase::inner));
  e.round_ended = false;
  p->begin_round();  // round 2 ends while round 1's all-reduce still runs
  CATCH_CHECK(!e.round_ended);
  CATCH_CHECK(e.ph == phase::reducing);
  e.finish_reduces();  // it comes: the outer step of round 2 goes on
  CATCH_CHECK(e.round_ended);
  CATCH_CHECK(lines_of(e, "outer") == std::vector<std::string>{"outer (1,0)"});
}

CATCH_TEST_CASE(
    "eager steps every replica with its own pseudo-gradient and ends on the mean of the parameters",
    "[unit][round]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::eager, 2));
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  CATCH_CHECK(lines_of(e, "eager") ==
              std::vector<std::string>{"eager 1 no-avg", "eager 2 with-avg", "eager 3 with-avg"});
  // The final mean of the parameters goes in fp32 under ring label (T, 1), then replaces theta.
  CATCH_CHECK(lines_of(e, "start_reduce") == std::vector<std::string>{"start_reduce (1,0)",
                                                                      "start_reduce (2,0)",
                                                                      "start_reduce (2,1) exact"});
  CATCH_CHECK(e.calls.back() == "trained");
  CATCH_CHECK(e.calls[e.calls.size() - 2] == "set_theta");
  // A resume snapshot without per-replica outer state starts every replica from theta.
  runtime::train_snapshot snap;
  snap.theta = at::ones({4});
  snap.replicas.resize(2);
  const auto outer = p->replica_outer_state(snap);
  CATCH_REQUIRE(outer.size() == 2);
  CATCH_CHECK(at::equal(outer[1].theta, snap.theta));
}

CATCH_TEST_CASE("streaming runs segments between fragment events and syncs the fragments left at the end",
                "[unit][round]") {
  // H = 4, P = 2, tau = 1: fragment 1 snapshots at 1 and syncs at 2, fragment 0 snapshots at 3, syncs at 4.
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::streaming, 1));
  auto p = make_round_policy(e, e.ctx);
  CATCH_CHECK(p->stops() == stop_rule::at_next_boundary);
  run_all(e, *p);
  const std::vector<std::string> expected{"-- round 1",
                                          "theta",
                                          "run 1 x1 fragment 1",
                                          "start_reduce (1,1)",
                                          "run 1 x1 no-theta",
                                          "when_average (1,1)",
                                          "outer (1,1)",
                                          "mix 1",
                                          "theta",
                                          "run 1 x1 fragment 0",
                                          "start_reduce (1,2)",
                                          "run 1 x1 no-theta",
                                          "when_average (1,2)",
                                          "outer (1,2)",
                                          "mix 0",
                                          "round_done",
                                          "-- finish",
                                          "theta",
                                          "run 1 x0 fragment 1",
                                          "start_reduce (1,3)",
                                          "when_average (1,3) final",
                                          "outer (1,3)",
                                          "theta",
                                          "trained"};
  CATCH_CHECK(e.calls == expected);
  CATCH_CHECK(p->at_round_boundary());
}

CATCH_TEST_CASE("a streaming Ctrl-C lands at the next segment boundary with no fragment in flight",
                "[unit][round]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::streaming, 1));
  auto p = make_round_policy(e, e.ctx);
  e.stop = true;
  e.ph = phase::inner;
  p->begin_round();  // at step 0 nothing is in flight: it stops at once, at the round boundary
  CATCH_CHECK(e.calls == std::vector<std::string>{"stop boundary"});
  // A checkpoint stopped at step 1 (fragment 1's all-reduce would be in flight) is refused on resume.
  runtime::train_snapshot snap;
  snap.replicas.resize(2);
  snap.replicas[0].steps_in_round = 1;
  const auto refused = p->resume_from(snap);
  CATCH_CHECK(refused);
  // Another run's checkpoint, as for a mismatched shape: exit 1 (invalid_config said 2 and exited 1).
  CATCH_CHECK(refused.code() == static_cast<uint8_t>(longwave::errc::checkpoint_mismatch));
  snap.replicas[0].steps_in_round = 2;
  CATCH_CHECK(!p->resume_from(snap));
  CATCH_CHECK(!p->at_round_boundary());
}

CATCH_TEST_CASE("ddp runs H synchronous grad, reduce, apply steps and mirrors the replica into theta",
                "[unit][round]") {
  fake_engine e(two_workers(config::run_mode::ddp, config::outer_policy_kind::sync, 1));
  auto p = make_round_policy(e, e.ctx);
  run_all(e, *p);
  CATCH_CHECK(lines_of(e, "grad").size() == 4);
  // Each step's all-reduce has a label of its own, increasing across the rounds.
  CATCH_CHECK(lines_of(e, "reduce_gradients") ==
              std::vector<std::string>{"reduce_gradients 1", "reduce_gradients 2", "reduce_gradients 3",
                                       "reduce_gradients 4"});
  CATCH_CHECK(lines_of(e, "report 1@") ==
              std::vector<std::string>{"report 1@1", "report 1@2", "report 1@3", "report 1@4"});
  CATCH_CHECK(at::equal(e.trained, at::full({4}, 7.0f)));  // the lent replica's weights
  CATCH_CHECK(p->stops() == stop_rule::at_next_boundary);
  // Ctrl-C between two steps: stop there, mid-round.
  fake_engine s(two_workers(config::run_mode::ddp, config::outer_policy_kind::sync, 1));
  auto q = make_round_policy(s, s.ctx);
  s.stop = true;
  s.ph = phase::inner;
  q->begin_round();
  CATCH_CHECK(s.calls == std::vector<std::string>{"stop mid-round"});
}

namespace {

/// async's merge message: version v merges these (node, v_start) contributions of `tokens` each.
runtime::merge_order merge_of(uint64_t v, std::vector<std::pair<std::string, uint64_t>> merged,
                              uint64_t tokens) {
  runtime::merge_order o;
  o.version = v;
  for (auto& [node, start] : merged) o.merged.push_back({node, start, tokens, 1});
  return o;
}

/// One local phase of an async node, as the coordinator runs it (phase inner, begin_round, the round tail).
void async_phase(fake_engine& e, round_policy& p) {
  e.ph = phase::idle;
  CATCH_REQUIRE(e.set_phase(phase::inner));
  e.round_ended = false;
  p.begin_round();
  CATCH_REQUIRE(e.round_ended);
}

}  // namespace

CATCH_TEST_CASE("async contributes each phase, merges what the master names, and ends at the last version",
                "[unit][round][async]") {
  auto cfg = two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 2);  // 2 versions
  fake_engine e(cfg);
  const auto tokens = static_cast<uint64_t>(4 * e.ctx.inner.batch_size * e.ctx.spec.seq_len * 2);
  auto p = make_round_policy(e, e.ctx);
  CATCH_CHECK(p->stops() == stop_rule::at_next_boundary);
  CATCH_CHECK(!p->lends_boundary_snapshot());
  async_phase(e, *p);
  // async.rebase_steps = 1: the phase runs a step at a time, no newer version comes, so no reload.
  // Only the first and the last step measure a pseudo-gradient.
  CATCH_CHECK(e.calls == std::vector<std::string>{"thetas", "run 1 x1 reset", "run 1 x1 no-theta",
                                                  "run 1 x1 no-theta", "run 1 x1", "contribute 0", "theta",
                                                  "round_done"});
  CATCH_CHECK(e.contributions == std::vector<std::pair<uint64_t, uint64_t>>{{0, tokens}});
  // Version 1 merges another node's: this node relays zeros with weight 0, and theta does not move.
  e.calls.clear();
  p->on_merge(merge_of(1, {{"b", 0}}, tokens));
  CATCH_CHECK(e.calls ==
              std::vector<std::string>{"start_reduce (1,0) of 0.000001", "merge 1 of 1", "version 1"});
  CATCH_CHECK(at::equal(e.global, at::zeros({4})));
  CATCH_CHECK(!p->run_over(5));
  // Version 2 merges this node's (started at 0, one version old): its workers' mean, weighted by its tokens.
  e.calls.clear();
  p->on_merge(merge_of(2, {{"a", 0}, {"b", 1}}, tokens));
  CATCH_CHECK(e.calls == std::vector<std::string>{"start_reduce (2,0) of " + std::to_string(double(tokens)),
                                                  "merge 2 of 2", "version 2"});
  CATCH_CHECK(at::allclose(e.global, at::full({4}, -0.15f)));
  // train.rounds = 2 versions: the run is over, later merges are not taken, the phase that ends is not sent.
  // The phase after round 1 is the last: its round tail is the final evaluation and checkpoint.
  CATCH_CHECK(!p->run_over(1));
  CATCH_CHECK(p->run_over(2));
  e.calls.clear();
  p->on_merge(merge_of(3, {{"b", 2}}, tokens));
  p->on_merge(merge_of(5, {{"b", 4}}, tokens));  // nor is a gap after the end a failure
  CATCH_CHECK(e.calls.empty());
  async_phase(e, *p);
  CATCH_CHECK(lines_of(e, "contribute").empty());
  CATCH_CHECK(e.versions == std::vector<uint64_t>{1, 2});
}

CATCH_TEST_CASE(
    "async holds back phases the master has not answered, folds them as their mean, and reports on a "
    "drop",
    "[unit][round][async]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 10));
  const auto tokens = static_cast<uint64_t>(4 * e.ctx.inner.batch_size * e.ctx.spec.seq_len * 2);
  auto p = make_round_policy(e, e.ctx);
  for (int i = 0; i < 3; ++i) async_phase(e, *p);  // one reported, two held back as their mean
  CATCH_CHECK(e.contributions.size() == 1);
  // The master drops the first (too stale): the held mean is reported in its place, from version 0.
  runtime::merge_order drop;
  drop.version = 0;
  drop.dropped.push_back({"a", 0, tokens, 1});
  drop.dropped.push_back({"b", 0, tokens, 1});  // another node's drop changes nothing here
  p->on_merge(drop);
  CATCH_CHECK(e.contributions == std::vector<std::pair<uint64_t, uint64_t>>{{0, tokens}, {0, 2 * tokens}});
  CATCH_CHECK(e.metrics["longwave_outer_dropped_contributions_total"] == 1);
  CATCH_CHECK(e.metrics["longwave_outer_contributions_total"] == 2);
  // One "contribution" line per phase; only the first was sent when it ended.
  std::vector<bool> sent;
  for (const auto& r : e.records)
    if (r.find("\"kind\":\"contribution\"") != std::string::npos)
      sent.push_back(r.find("\"sent\":true") != std::string::npos);
  CATCH_CHECK(sent == std::vector<bool>{true, false, false});
  CATCH_CHECK(std::count_if(e.records.begin(), e.records.end(), [](const std::string& r) {
                return r.find("\"kind\":\"dropped\"") != std::string::npos;
              }) == 1);
  e.calls.clear();
  p->on_merge(merge_of(1, {{"a", 0}}, 2 * tokens));
  CATCH_CHECK(e.calls.front() == "start_reduce (1,0) of " + std::to_string(double(2 * tokens)));
  // The mean of two phases' pseudo-gradients (each 0.1 and 0.2 on the two workers), weighted by all their
  // tokens: workers 0.1 and 0.2, mean 0.15; their sum (0.3) would count two phases from one version.
  CATCH_CHECK(at::allclose(e.global, at::full({4}, -0.15f)));
  // Nothing is held any more: the next phase is reported at once, from version 1.
  async_phase(e, *p);
  CATCH_CHECK(e.contributions.back().first == 1);
}

CATCH_TEST_CASE("async scales a stale pseudo-gradient by CGAD's rule and refuses a gap in the versions",
                "[unit][round][async]") {
  auto cfg = two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 10);
  cfg.async.age_scaling = config::age_scaling_kind::cgad;
  cfg.async.cgad_alpha = 0.25;
  cfg.async.cgad_cutoff = 6;
  fake_engine e(cfg);
  auto p = make_round_policy(e, e.ctx);
  async_phase(e, *p);
  p->on_merge(merge_of(1, {{"b", 0}}, 1));
  p->on_merge(merge_of(1, {{"b", 0}}, 1));  // announced twice (a master that took over): taken once
  CATCH_CHECK(lines_of(e, "merge").size() == 1);
  p->on_merge(merge_of(2, {{"b", 1}}, 1));
  p->on_merge(merge_of(3, {{"a", 0}}, 1));  // started at 0, merged into 3: two versions old
  CATCH_CHECK(e.metrics["longwave_outer_merge_staleness"] == 2);  // the one merged contribution's age
  const double k = models::cgad_scale(2, 0.25, 6);
  CATCH_CHECK(k > 0.1);
  CATCH_CHECK(k < 0.9);
  CATCH_CHECK(at::allclose(e.global, at::full({4}, static_cast<float>(-0.15 * k))));
  // Version 5 after 3: this node missed one, and its theta cannot be that of the others.
  e.calls.clear();
  p->on_merge(merge_of(5, {{"b", 3}}, 1));
  CATCH_CHECK(e.calls == std::vector<std::string>{"fail"});
}

CATCH_TEST_CASE(
    "async: a drop naming a version past every merge this node heard of fails it, but not at the end",
    "[unit][round][async]") {
  const auto drop_of = [](uint64_t version) {
    runtime::merge_order drop;
    drop.version = version;
    drop.dropped.push_back({"a", 0, 1, 1});
    return drop;
  };
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 10));
  auto p = make_round_policy(e, e.ctx);
  async_phase(e, *p);  // reported from version 0
  // The coordinator is at version 7 (this node resumed behind a run that went on): it trained on for ever.
  e.calls.clear();
  p->on_merge(drop_of(7));
  CATCH_CHECK(e.calls == std::vector<std::string>{"fail"});
  // train.rounds = 1: the phase reported before version 1 ended the run is dropped past the end, quietly.
  fake_engine f(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 1));
  auto q = make_round_policy(f, f.ctx);
  async_phase(f, *q);
  q->on_merge(merge_of(1, {{"b", 0}}, 1));
  CATCH_REQUIRE(q->run_over(2));  // version 1 is the last: the phase running now ends the run
  f.calls.clear();
  q->on_merge(drop_of(1));
  CATCH_CHECK(f.calls.empty());
  CATCH_CHECK(f.metrics["longwave_outer_dropped_contributions_total"] == 0);
}

CATCH_TEST_CASE("async: a resumed node alone in the adoption's all-reduce takes its own version",
                "[unit][round][async]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 10));
  e.rank = {1, 3};  // welcomed as one of three; the two others were lost before the all-reduce
  auto p = make_round_policy(e, e.ctx);
  runtime::train_snapshot snap;
  snap.replicas.resize(2);
  snap.version = 4;
  CATCH_REQUIRE(!p->resume_from(snap));
  async_phase(e, *p);
  // The mean of one node's slots read as a third of each version made it 12, past train.rounds = 10.
  CATCH_REQUIRE_FALSE(e.versions.empty());
  CATCH_CHECK(e.versions.front() == 4);
  CATCH_CHECK(!p->run_over(1));
  CATCH_CHECK(e.contributions.back().first == 4);
}

CATCH_TEST_CASE("async: a node that resumes or joins at the run's last version ends without another phase",
                "[unit][round][async]") {
  struct row {
    const char* what;
    std::pair<int64_t, int64_t> rank;  // at the welcome: this node's, and the ring's size
    bool joined;                       // fetched the members' state (no adoption)
    int64_t rounds;                    // train.rounds, in versions; the state holds version 4
  };
  for (const auto& r : {row{"resumed alone", {0, 1}, false, 4},
                        row{"one of three, the two others lost before the adoption", {1, 3}, false, 4},
                        row{"a joiner that fetched it", {1, 2}, true, 4},
                        row{"a version before the last: the phase runs as ever", {0, 1}, false, 5}}) {
    CATCH_DYNAMIC_SECTION(r.what) {
      fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, r.rounds));
      e.rank = r.rank;
      if (r.joined) e.ctx.recovery = recovery_info{};
      e.done = 9;  // the node's own phases
      auto p = make_round_policy(e, e.ctx);
      runtime::train_snapshot snap;
      snap.replicas.resize(2);
      snap.version = 4;
      CATCH_REQUIRE(!p->resume_from(snap));
      e.ph = phase::idle;
      CATCH_REQUIRE(e.set_phase(phase::inner));
      p->begin_round();
      const bool last = r.rounds == 4;
      CATCH_CHECK(lines_of(e, "run").empty() == last);
      CATCH_CHECK(lines_of(e, "contribute") ==
                  (last ? std::vector<std::string>{} : std::vector<std::string>{"contribute 4"}));
      CATCH_CHECK((e.calls.back() == "trained") == last);
      CATCH_CHECK(p->run_over(9) == last);  // its round tail is the last evaluation and checkpoint
      if (r.rank.second > 1) CATCH_CHECK(e.versions == std::vector<uint64_t>{4});  // adopted, or joined at
    }
  }
}

CATCH_TEST_CASE(
    "async counts the contributions its all-reduce held: a contributor lost before it is no arrival",
    "[unit][round][async]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 10));
  auto p = make_round_policy(e, e.ctx);
  async_phase(e, *p);
  // Node c left the ring before version 1's all-reduce: its epoch's members are a and b.
  e.members = {"a", "b"};
  p->on_merge(merge_of(1, {{"a", 0}, {"b", 0}, {"c", 0}}, 1));
  CATCH_CHECK(lines_of(e, "merge") == std::vector<std::string>{"merge 1 of 2"});
  CATCH_REQUIRE(e.version_lines.size() == 1);
  CATCH_CHECK(e.version_lines[0].find("\"nodes\":2") != std::string::npos);
  CATCH_CHECK(e.version_lines[0].find("\"lost\":\"c\"") != std::string::npos);
  // Every contributor of version 2 was lost: the version still comes, with no arrival.
  p->on_merge(merge_of(2, {{"c", 1}, {"d", 1}}, 1));
  CATCH_CHECK(lines_of(e, "merge").back() == "merge 2 of 0");
  CATCH_CHECK(e.versions == std::vector<uint64_t>{1, 2});
  // A collective that does not know its members (one process) loses nobody.
  e.members.clear();
  p->on_merge(merge_of(3, {{"c", 2}}, 1));
  CATCH_CHECK(lines_of(e, "merge").back() == "merge 3 of 1");
}

CATCH_TEST_CASE("async takes a merge once the one before is applied, and none past the last version",
                "[unit][round][async]") {
  auto cfg = two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 2);
  fake_engine e(cfg);
  e.slow_link = true;
  auto p = make_round_policy(e, e.ctx);
  async_phase(e, *p);
  p->on_merge(merge_of(1, {{"b", 0}}, 1));
  p->on_merge(merge_of(2, {{"b", 1}}, 1));  // announced while version 1's all-reduce runs: it waits
  p->on_merge(merge_of(3, {{"b", 2}}, 1));
  CATCH_CHECK(lines_of(e, "start_reduce") == std::vector<std::string>{"start_reduce (1,0) of 0.000001"});
  CATCH_CHECK(!p->run_over(5));
  e.finish_reduces();  // version 1, then 2 (the last): 3 is not taken
  CATCH_CHECK(lines_of(e, "start_reduce") ==
              std::vector<std::string>{"start_reduce (1,0) of 0.000001", "start_reduce (2,0) of 0.000001"});
  CATCH_CHECK(e.versions == std::vector<uint64_t>{1, 2});
  CATCH_CHECK(p->run_over(2));
  // async.tokens ends it the same way: at the merge that brings the merged tokens to the budget.
  cfg.train.rounds = 100;
  cfg.async.tokens = 10;
  fake_engine t(cfg);
  auto q = make_round_policy(t, t.ctx);
  async_phase(t, *q);
  for (uint64_t v = 1; v <= 4; ++v) q->on_merge(merge_of(v, {{"b", v - 1}}, 4));  // 4, 8, 12: the third
  CATCH_CHECK(t.versions == std::vector<uint64_t>{1, 2, 3});
  // Tokens of a contributor lost before its all-reduce are not merged: they count toward neither
  // merged_tokens nor the budget, on every node alike.
  fake_engine l(cfg);
  auto r = make_round_policy(l, l.ctx);
  async_phase(l, *r);
  l.members = {"a", "b"};
  r->on_merge(merge_of(1, {{"b", 0}, {"c", 0}}, 4));  // 4 merged, 4 lost
  r->on_merge(merge_of(2, {{"b", 1}}, 4));            // 8
  r->on_merge(merge_of(3, {{"b", 2}}, 4));            // 12: the last
  r->on_merge(merge_of(4, {{"b", 3}}, 4));
  CATCH_CHECK(l.versions == std::vector<uint64_t>{1, 2, 3});
  CATCH_REQUIRE(l.version_lines.size() == 3);
  CATCH_CHECK(l.version_lines[0].find("\"tokens\":4,\"merged_tokens\":4,\"lost\":\"c\",\"lost_tokens\":4") !=
              std::string::npos);
  CATCH_CHECK(l.version_lines[2].find("\"merged_tokens\":12") != std::string::npos);
}

CATCH_TEST_CASE(
    "async takes in a version applied mid-phase: the workers move with theta, the phase counts from it",
    "[unit][round][async]") {
  fake_engine e(two_workers(config::run_mode::diloco, config::outer_policy_kind::async, 10));
  const auto tokens = static_cast<uint64_t>(4 * e.ctx.inner.batch_size * e.ctx.spec.seq_len * 2);
  auto p = make_round_policy(e, e.ctx);
  async_phase(e, *p);  // phase 1 from version 0: workers' deltas 0.1 and 0.2, reported
  e.hold_runs = true;
  e.ph = phase::idle;
  CATCH_REQUIRE(e.set_phase(phase::inner));
  p->begin_round();  // phase 2 from version 0
  e.release_run();   // its first step: nothing newer, the workers go on
  CATCH_CHECK(e.calls.back() == "run 2 x1 no-theta");
  // Version 1 merges phase 1 (mean 0.15) while phase 2 trains: theta is -0.15.
  p->on_merge(merge_of(1, {{"a", 0}}, tokens));
  CATCH_CHECK(at::allclose(e.global, at::full({4}, -0.15f)));
  e.calls.clear();
  e.release_run();
  // The workers' progress so far is measured (a run of no steps: 0.1 and 0.2); the next step starts from
  // theta minus it: w moved with theta.
  CATCH_CHECK(e.calls == std::vector<std::string>{"run 2 x0"});
  e.release_run();
  CATCH_CHECK(e.calls == std::vector<std::string>{"run 2 x0", "theta", "run 2 x1 reset"});
  CATCH_CHECK(at::allclose(e.run_thetas[0], at::full({4}, -0.25f)));
  CATCH_CHECK(at::allclose(e.run_thetas[1], at::full({4}, -0.35f)));
  CATCH_CHECK(e.metrics["longwave_outer_rebases_total"] == 1);
  e.release_run();
  CATCH_CHECK(e.calls.back() == "run 2 x1");  // the last step measures the phase's pseudo-gradient
  e.release_run();
  CATCH_CHECK(e.calls.back() == "round_done");
  // Reported from version 1, its progress carried over the reload: 0.1 + 0.1 and 0.2 + 0.2.
  CATCH_CHECK(e.contributions.back().first == 1);
  e.hold_runs = false;
  p->on_merge(merge_of(2, {{"a", 1}}, tokens));
  CATCH_CHECK(at::allclose(e.global, at::full({4}, -0.45f)));
  CATCH_CHECK(e.metrics["longwave_outer_merge_staleness"] == 0);  // merged into the version after its base
}
