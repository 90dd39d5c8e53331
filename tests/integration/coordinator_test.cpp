// The coordinator as an actor, deterministically: CAF's test coordinator (one thread, virtual time) runs it
// with fake workers, communicator, outer optimizer and checkpointer. Each case asserts on the phases it goes
// through (its debug log of set_phase), on what it asks of its peers, and on its final (done, code, loss).
// The fakes are dynamically typed (they also take the test's own release message) and handed to the
// coordinator through actor_cast: their handlers follow runtime/messages/interfaces.hpp by hand.
#include <ATen/ATen.h>
#include <rapidjson/document.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/run_context.hpp"
#include "models/model_spec.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"
#include "tests/support/process.hpp"

// CAF's deterministic scheduler fixture, without CAF's own test main (Catch2 has the main).
#define CAF_TEST_NO_MAIN
#include <caf/test/dsl.hpp>
#include <caf/test/unit_test_impl.hpp>

using namespace longwave;
using namespace longwave::runtime;

namespace {

/// Test only: a fake hands over the replies it holds back (see world::hold).
using release_atom = caf::atom_constant<caf::atom("release")>;
constexpr release_atom release_atom_v{};

/// What the fakes saw and how they answer; every actor runs on the test's one thread.
struct world {
  std::vector<std::string> seen;  // "w0 run 1", "reduce 1", "outer 1", "save 1", "flush", "done 0", ...
  /// (kind, round) -> whether the reply waits for (release, kind): "run", "reduce", "outer", "outer_state",
  /// "eval", "load", "save". The answer is computed at release, so a knob set meanwhile applies.
  std::function<bool(const std::string&, uint64_t)> hold;
  /// A non-empty error is the communicator's answer to the reduce of that round.
  std::function<caf::error(uint64_t)> reduce_error;
  /// A non-empty error is the checkpointer's answer to the save of that round (0-based call count too).
  std::function<caf::error(uint64_t round, int call)> save_error;
  int save_calls = 0;
  std::vector<train_snapshot> saved;  // written snapshots
  std::vector<uint64_t> outer_rounds;
  std::vector<float> outer_avgs;     // first element of each average the outer optimizer applied
  std::vector<int> codes;            // every (done, code, ...) the main actor got
  std::vector<std::string> records;  // metrics.jsonl lines the coordinator sent
  double val_loss = 0;
  bool held(const std::string& kind, uint64_t round) const { return hold && hold(kind, round); }
};

struct held_reply {
  std::string kind;
  std::function<void()> deliver;
};

struct fake_state {
  std::deque<held_reply> held;
  int64_t steps = 0;  // worker: inner steps done
  bool running = false;
  at::Tensor theta;  // outer: theta_global
  uint64_t round = 0;
};

using fake_ptr = caf::stateful_actor<fake_state>*;

/// Answers now, or keeps the promise until (release, kind) when the world holds (kind, round).
template <class T>
caf::result<T> reply(fake_ptr self, const std::shared_ptr<world>& w, const std::string& kind, uint64_t round,
                     std::function<caf::expected<T>()> answer) {
  if (!w->held(kind, round)) return answer();
  auto rp = self->make_response_promise();
  self->state.held.push_back({kind, [rp, answer]() mutable {
                                auto x = answer();
                                if (x)
                                  rp.deliver(std::move(*x));
                                else
                                  rp.deliver(x.error());
                              }});
  return caf::delegated<T>{};
}

/// The first held reply of `kind` goes out.
auto release_handler(fake_ptr self) {
  return [=](release_atom, const std::string& kind) {
    auto& h = self->state.held;
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it->kind != kind) continue;
      auto f = std::move(it->deliver);
      h.erase(it);
      f();
      return;
    }
  };
}

at::Tensor small(float v) {
  return at::full({4}, v, at::kFloat);
}

/// Worker `rank`: Δ = 0.1 (rank + 1) every round. Paused mid-round it has done rank + 1 steps of the round.
caf::behavior fake_worker(fake_ptr self, std::shared_ptr<world> w, int64_t rank) {
  const std::string me = "w" + std::to_string(rank);
  auto replica = [=](int64_t steps) {
    replica_state r;
    r.rank = rank;
    r.master = small(0);
    r.exp_avg = small(0);
    r.exp_avg_sq = small(0);
    r.adam_steps = steps;
    return r;
  };
  return {
      release_handler(self),
      [=](set_atom, const at::Tensor&) -> caf::result<bool> {
        w->seen.push_back(me + " theta");
        return reply<bool>(self, w, "set", 0, [] { return caf::expected<bool>{true}; });
      },
      [=](run_atom, uint64_t round, const at::Tensor&, int64_t h, bool,
          int64_t) -> caf::result<round_result> {
        w->seen.push_back(me + " run " + std::to_string(round));
        self->state.running = true;
        return reply<round_result>(self, w, "run", round, [=]() -> caf::expected<round_result> {
          self->state.running = false;
          self->state.steps += h;
          round_result r;
          r.rank = rank;
          r.round = round;
          r.delta = small(0.1f * static_cast<float>(rank + 1));
          r.mean_loss = 3.0;
          r.load_s = 0.01, r.delta_s = 0.02, r.round_s = 0.05;  // the host seconds a real worker measures
          return r;
        });
      },
      [=](pause_atom) -> int64_t {
        w->seen.push_back(me + " pause");
        return self->state.steps + (self->state.running ? rank + 1 : 0);
      },
      [=](state_atom) {
        w->seen.push_back(me + " state");
        return replica(self->state.steps);
      },
      [=](state_atom, bool) {  // lent: the same state, by handle
        w->seen.push_back(me + " state");
        return replica(self->state.steps);
      },
      [=](state_atom, int64_t target) {
        w->seen.push_back(me + " state " + std::to_string(target));
        auto r = replica(target);
        r.steps_in_round = target - self->state.steps;
        return r;
      },
      [=](load_atom, const replica_state& r) -> caf::result<bool> {
        w->seen.push_back(me + " load");
        self->state.steps = r.adam_steps;
        return reply<bool>(self, w, "load", 0, [] { return caf::expected<bool>{true}; });
      },
      [=](eval_atom, const at::Tensor&, int64_t) -> caf::result<double> {
        w->seen.push_back(me + " eval");
        return reply<double>(self, w, "eval", 0, [] { return caf::expected<double>{2.5}; });
      },
  };
}

/// The mean of the parts, or the world's error for that round.
caf::behavior fake_communicator(fake_ptr self, std::shared_ptr<world> w) {
  auto reduce = [=](uint64_t round, std::vector<at::Tensor> parts) -> caf::result<reduced> {
    w->seen.push_back("reduce " + std::to_string(round));
    return reply<reduced>(self, w, "reduce", round, [=]() -> caf::expected<reduced> {
      if (w->reduce_error)
        if (auto e = w->reduce_error(round)) return e;
      return reduced{at::stack(parts).mean(0), {}};
    });
  };
  return {
      release_handler(self),
      [=](reduce_atom, reduce_request& r) { return reduce(r.label.first, std::move(r.parts)); },
  };
}

/// theta_global starts at 0; the outer step is theta -= avg (lr 1, no momentum).
caf::behavior fake_outer(fake_ptr self, std::shared_ptr<world> w) {
  self->state.theta = small(0);
  return {
      release_handler(self),
      [=](theta_atom) { return self->state.theta; },
      [=](replicas_atom, int64_t n) {
        return std::vector<at::Tensor>(static_cast<size_t>(n), self->state.theta);
      },
      [=](outer_atom, ring_label label, const at::Tensor& avg) -> caf::result<at::Tensor> {
        const uint64_t round = label.first;
        w->seen.push_back("outer " + std::to_string(round));
        w->outer_rounds.push_back(round);
        w->outer_avgs.push_back(avg[0].item<float>());
        return reply<at::Tensor>(self, w, "outer", round, [=]() -> caf::expected<at::Tensor> {
          self->state.theta = self->state.theta - avg;
          self->state.round = round;
          return self->state.theta;
        });
      },
      [=](prepare_atom, ring_label label, const at::Tensor&) {
        w->seen.push_back("prepare " + std::to_string(label.first));  // an early step: nothing to apply
      },
      [=](state_atom, bool lend) -> caf::result<outer_snapshot> {
        w->seen.push_back("outer state");
        return reply<outer_snapshot>(self, w, "outer_state", self->state.round, [=] {
          auto theta = lend ? self->state.theta : self->state.theta.clone();
          return caf::expected<outer_snapshot>{outer_snapshot{theta, at::Tensor(), {}, 0, {}, 0}};
        });
      },
      [=](load_atom, const outer_snapshot& snap) {
        w->seen.push_back("outer load");
        self->state.theta = snap.theta;
        return true;
      },
  };
}

/// Keeps every written snapshot; answers the world's error instead where it has one.
caf::behavior fake_checkpointer(fake_ptr self, std::shared_ptr<world> w) {
  return {
      release_handler(self),
      [=](save_atom, train_snapshot snap) -> caf::result<std::string> {
        w->seen.push_back("save " + std::to_string(snap.round));
        const int call = w->save_calls++;
        auto holder = std::make_shared<train_snapshot>(std::move(snap));
        return reply<std::string>(self, w, "save", holder->round, [=]() -> caf::expected<std::string> {
          if (w->save_error)
            if (auto e = w->save_error(holder->round, call)) return e;
          w->saved.push_back(*holder);
          return "ckpt-" + std::to_string(holder->round) + "-" + std::to_string(holder->step);
        });
      },
      [=](flush_atom) {
        w->seen.push_back("flush");
        return true;
      },
  };
}

/// Keeps the coordinator's metrics.jsonl records; drops the rest.
caf::behavior metrics_sink(std::shared_ptr<world> w) {
  return {
      [](gauge_atom, const std::string&, const std::string&, double) {},
      [](count_atom, const std::string&, const std::string&, double) {},
      [](observe_atom, const std::string&, const std::string&, double) {},
      [w](record_atom, const std::string& line) { w->records.push_back(line); },
  };
}

/// Stands for the main thread: sends (start) and keeps every (done, code, val_loss).
caf::behavior fake_main(caf::event_based_actor* self, std::shared_ptr<world> w, caf::actor coordinator) {
  self->send(coordinator, start_atom_v);
  return {
      [=](done_atom, int code, double loss) {
        w->seen.push_back("done " + std::to_string(code));
        w->codes.push_back(code);
        w->val_loss = loss;
      },
  };
}

/// Holds the first `kind` request of `round` (or of any round when round is 0); later ones are answered.
std::function<bool(const std::string&, uint64_t)> hold_first(const std::string& kind, uint64_t round = 0) {
  auto done = std::make_shared<bool>(false);
  return [=](const std::string& k, uint64_t r) {
    if (*done || k != kind || (round != 0 && r != round)) return false;
    *done = true;
    return true;
  };
}

std::function<bool(const std::string&, uint64_t)> hold_all(const std::string& kind, uint64_t round = 0) {
  return [=](const std::string& k, uint64_t r) { return k == kind && (round == 0 || r == round); };
}

/// A round-boundary snapshot after `round` rounds of 4 steps, theta = -0.15 round, for 2 workers.
train_snapshot resume_snapshot(uint64_t round) {
  train_snapshot snap;
  snap.round = round;
  snap.step = 4 * round;
  snap.theta = small(-0.15f * static_cast<float>(round));
  for (int64_t r = 0; r < 2; ++r) {
    replica_state rs;
    rs.rank = r;
    rs.master = small(0);
    rs.adam_steps = static_cast<int64_t>(snap.step);
    snap.replicas.push_back(rs);
  }
  return snap;
}

struct lw_config : caf::actor_system_config {
  lw_config() { add_message_types<caf::id_block::longwave>(); }
};

struct coordinator_fixture : test_coordinator_fixture<lw_config> {
  std::shared_ptr<world> w = std::make_shared<world>();
  std::string dir = test::scratch_dir("coordinator");
  std::ostringstream log;
  std::shared_ptr<spdlog::logger> previous_logger = spdlog::default_logger();
  config::train_config cfg;
  caf::actor coordinator, communicator, outer, checkpointer, metrics, main;
  std::vector<caf::actor> workers;

  coordinator_fixture() {
    // The coordinator logs every move at debug level ("coordinator: inner -> reducing"): the phase sequence.
    auto logger = std::make_shared<spdlog::logger>("coordinator_test",
                                                   std::make_shared<spdlog::sinks::ostream_sink_st>(log));
    logger->set_pattern("%v");
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
    cfg.run.out_dir = dir;
    cfg.metrics.enabled = false;
    cfg.train.workers = 2;
    cfg.train.inner_steps = 4;
    cfg.train.rounds = 2;
    cfg.eval.every_rounds = 0;  // only the last round, on worker 0 (no evaluator)
    cfg.checkpoint.every_rounds = 1;
    cfg.checkpoint.max_failed_writes = 2;
  }

  ~coordinator_fixture() override {
    for (auto& a : {main, coordinator, communicator, outer, checkpointer, metrics})
      if (a) caf::anon_send_exit(a, caf::exit_reason::kill);
    for (auto& a : workers) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
    spdlog::set_default_logger(previous_logger);
    std::filesystem::remove_all(dir);
  }

  /// Spawns the fakes and the coordinator, sends (start) and runs until nothing is left to do (timeouts
  /// only fire when the test advances the clock).
  void launch(std::optional<train_snapshot> resume = std::nullopt) {
    auto ctx = std::make_shared<actors::run_context>();
    ctx->cfg = cfg;
    ctx->spec = models::preset_spec("tiny", 256, 16);
    ctx->inner = actors::make_inner_options(cfg);
    ctx->planned_steps = ctx->inner.total_steps;
    actors::coordinator_peers peers;
    peers.communicator = caf::actor_cast<communicator_actor>(communicator = sys.spawn(fake_communicator, w));
    peers.outer = caf::actor_cast<outer_actor>(outer = sys.spawn(fake_outer, w));
    peers.checkpointer = caf::actor_cast<checkpointer_actor>(checkpointer = sys.spawn(fake_checkpointer, w));
    peers.metrics = caf::actor_cast<metrics_actor>(metrics = sys.spawn(metrics_sink, w));
    peers.worker_factory = [this](caf::actor_system& s, int64_t rank, coordinator_actor) {
      workers.push_back(s.spawn(fake_worker, w, rank));
      return caf::actor_cast<worker_actor>(workers.back());
    };
    coordinator = caf::actor_cast<caf::actor>(
        actors::spawn_coordinator(sys, ctx, std::move(peers), std::move(resume), ""));
    main = sys.spawn(fake_main, w, coordinator);
    sched.run();
  }

  void settle() { sched.run(); }

  void release(const caf::actor& who, const std::string& kind) {
    caf::anon_send(who, release_atom_v, kind);
    settle();
  }

  void stop() {
    caf::anon_send(coordinator, stop_atom_v);
    settle();
  }

  /// Holds the first `kind` reply of `round` (from `holder()`, known once launched), sends (stop) while the
  /// coordinator waits for it, then lets the reply go. Returns the phases at the stop.
  std::string stop_while_held(const std::string& kind, uint64_t round, std::function<caf::actor()> holder,
                              std::function<void()> while_held = {}) {
    w->hold = hold_first(kind, round);
    launch();
    const auto at_stop = phases();
    stop();
    CATCH_CHECK(w->codes.empty());  // the stop waits for the reply
    if (while_held) while_held();
    release(holder(), kind);
    return at_stop;
  }

  /// The phases the coordinator went through, from its log: "idle inner reducing ...".
  std::string phases() const {
    std::istringstream in(log.str());
    std::string line, out = "idle";
    const std::string prefix = "coordinator: ";
    while (std::getline(in, line)) {
      if (line.rfind(prefix, 0) != 0 || line.find("refused") != std::string::npos) continue;
      const auto arrow = line.find(" -> ");
      if (arrow == std::string::npos) continue;
      out += " " + line.substr(arrow + 4);
    }
    return out;
  }

  /// The events the fakes saw whose text starts with one of the prefixes, in order.
  std::vector<std::string> seen(std::initializer_list<std::string> prefixes) const {
    std::vector<std::string> out;
    for (const auto& e : w->seen)
      for (const auto& p : prefixes)
        if (e.rfind(p, 0) == 0) {
          out.push_back(e);
          break;
        }
    return out;
  }

  std::vector<uint64_t> saved_rounds() const {
    std::vector<uint64_t> out;
    for (const auto& s : w->saved) out.push_back(s.round);
    return out;
  }

  bool logged(const std::string& text) const { return log.str().find(text) != std::string::npos; }

  /// A run whose round 1 all-reduce is held for `ms` of wall time while the coordinator waits in reducing.
  void run_holding_first_reduce(int ms) {
    cfg.checkpoint.every_rounds = 0;
    w->hold = hold_first("reduce", 1);
    launch();
    CATCH_REQUIRE(phases() == "idle inner reducing");
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    release(communicator, "reduce");
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
  }

  /// The coordinator's metrics.jsonl records of `kind`, parsed.
  std::vector<rapidjson::Document> records_of(const std::string& kind) const {
    std::vector<rapidjson::Document> out;
    for (const auto& line : w->records) {
      rapidjson::Document d;
      d.Parse(line.c_str());
      CATCH_REQUIRE(!d.HasParseError());
      if (std::string(d["kind"].GetString()) == kind) out.push_back(std::move(d));
    }
    return out;
  }
};

using strings = std::vector<std::string>;

}  // namespace

CATCH_TEST_CASE_METHOD(coordinator_fixture,
                       "the coordinator drives sync and delayed rounds in order and ends with done 0",
                       "[integration][coordinator]") {
  CATCH_SECTION(
      "a fresh sync run of two rounds asks for run, reduce, outer and save in order and ends with done 0") {
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
    CATCH_CHECK(w->val_loss == 2.5);
    CATCH_CHECK(phases() ==
                "idle inner reducing outer_step saving inner reducing outer_step saving evaluating done");
    CATCH_CHECK(seen({"w", "reduce", "outer", "save", "flush", "done"}) ==
                strings{"w0 theta", "w1 theta", "w0 run 1",    "w1 run 1", "reduce 1",    "outer 1",
                        "w0 state", "w1 state", "outer state", "save 1",   "w0 run 2",    "w1 run 2",
                        "reduce 2", "outer 2",  "w0 state",    "w1 state", "outer state", "save 2",
                        "flush",    "w0 eval",  "flush",       "done 0"});
    // The average of the workers' 0.1 and 0.2, applied once per round.
    CATCH_REQUIRE(w->outer_avgs.size() == 2);
    CATCH_CHECK(w->outer_avgs[0] == Approx(0.15));
    CATCH_REQUIRE(w->saved.size() == 2);
    CATCH_CHECK(w->saved[1].round == 2);
    CATCH_CHECK(w->saved[1].step == 8);
    CATCH_CHECK(w->saved[1].theta[0].item<float>() == Approx(-0.3));
  }

  CATCH_SECTION("a resumed run with checkpoints only at the end goes from round to round without saving") {
    cfg.train.rounds = 3;
    cfg.checkpoint.every_rounds = 0;
    launch(resume_snapshot(1));
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
    CATCH_CHECK(phases() ==
                "idle resuming inner reducing outer_step inner reducing outer_step saving evaluating done");
    CATCH_CHECK(seen({"w0 run", "save"}) == strings{"w0 run 2", "w0 run 3", "save 3"});
    CATCH_CHECK(w->saved.back().step == 12);
  }

  CATCH_SECTION("an evaluation every round on the training path comes before the next round") {
    cfg.checkpoint.every_rounds = 0;
    cfg.eval.every_rounds = 1;
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
    CATCH_CHECK(phases() ==
                "idle inner reducing outer_step evaluating inner reducing outer_step saving evaluating done");
    CATCH_CHECK(seen({"w0 run", "w0 eval"}) == strings{"w0 run 1", "w0 eval", "w0 run 2", "w0 eval"});
  }

  CATCH_SECTION(
      "delayed: an average that comes after the next round ended stalls the workers, then the outer steps "
      "apply rounds 1, 2 and 3 in order") {
    cfg.diloco.outer = config::outer_policy_kind::delayed;
    cfg.train.rounds = 3;
    w->hold = hold_all("reduce");
    launch();
    CATCH_INFO(log.str());
    // Round 1 applies nothing; round 2 ended and waits for round 1's average: no round 3 yet, no save (the
    // snapshot of round 1 carries that average and waits for it too).
    CATCH_REQUIRE(phases() == "idle inner outer_step saving inner reducing");
    CATCH_CHECK(seen({"reduce", "outer 1", "save", "w0 run"}) ==
                strings{"w0 run 1", "reduce 1", "w0 run 2", "reduce 2"});
    release(communicator, "reduce");  // round 1's average
    CATCH_CHECK(w->outer_rounds == std::vector<uint64_t>{1});
    CATCH_CHECK(phases() == "idle inner outer_step saving inner reducing outer_step saving inner reducing");
    CATCH_REQUIRE(saved_rounds() == std::vector<uint64_t>{1});
    CATCH_CHECK(w->saved[0].pending_round == 1);
    CATCH_CHECK(w->saved[0].pending[0].item<float>() == Approx(0.15));
    release(communicator, "reduce");  // round 2's
    CATCH_CHECK(w->outer_rounds == std::vector<uint64_t>{1, 2});
    CATCH_CHECK(w->codes.empty());    // the last round's average is still running
    release(communicator, "reduce");  // round 3's, applied before the final evaluation
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
    CATCH_CHECK(w->outer_rounds == std::vector<uint64_t>{1, 2, 3});
    CATCH_CHECK(phases() ==
                "idle inner outer_step saving inner reducing outer_step saving inner reducing outer_step "
                "saving evaluating done");
    // The steps of rounds 1 and 2 were prepared once their averages came, before the steps that apply them;
    // the last round's is applied after the last round, unprepared.
    CATCH_CHECK(seen({"prepare", "outer 1", "outer 2", "outer 3"}) ==
                strings{"prepare 1", "outer 1", "prepare 2", "outer 2", "outer 3"});
    // Round k's snapshot caught its average when it was asked for, so its save goes out as that average
    // comes, before the step that applies it.
    CATCH_CHECK(seen({"reduce", "outer 1", "outer 2", "outer 3", "save", "w0 run", "w0 eval"}) ==
                strings{"w0 run 1", "reduce 1", "w0 run 2", "reduce 2", "save 1", "outer 1", "w0 run 3",
                        "reduce 3", "save 2", "outer 2", "outer 3", "save 3", "w0 eval"});
    CATCH_REQUIRE(saved_rounds() == std::vector<uint64_t>{1, 2, 3});
    CATCH_CHECK(w->saved[1].pending_round == 2);
    CATCH_CHECK(!w->saved[2].pending.defined());  // applied: the final snapshot does not carry it
  }
}

CATCH_TEST_CASE_METHOD(coordinator_fixture, "a stop in each phase ends the run as its stopping rules say",
                       "[integration][coordinator]") {
  CATCH_SECTION(
      "a stop in the inner phase pauses the workers, aligns them and saves a mid-round snapshot, then done "
      "130") {
    w->hold = hold_all("run", 2);
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes.empty());
    CATCH_REQUIRE(phases() == "idle inner reducing outer_step saving inner");
    const auto before = w->seen.size();
    // Two Ctrl-C: the second is ignored.
    caf::anon_send(coordinator, stop_atom_v);
    stop();
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() == "idle inner reducing outer_step saving inner stopping done");
    // Worker 0 stopped after 1 step of round 2, worker 1 after 2: both are brought to step 4 + 2.
    CATCH_CHECK(std::vector<std::string>(w->seen.begin() + static_cast<std::ptrdiff_t>(before),
                                         w->seen.end()) == strings{"w0 pause", "w1 pause", "w0 state 6",
                                                                   "w1 state 6", "outer state", "save 1",
                                                                   "flush", "done 130"});
    CATCH_REQUIRE(saved_rounds() == std::vector<uint64_t>{1, 1});
    CATCH_CHECK(w->saved.back().step == 6);
    CATCH_CHECK(w->saved.back().replicas.at(1).steps_in_round == 2);
    // The paused workers' round results come late: nothing follows.
    const auto after = w->seen.size();
    for (auto& wk : workers) release(wk, "run");
    CATCH_CHECK(w->seen.size() == after);
    CATCH_CHECK(w->codes.size() == 1);
  }

  CATCH_SECTION(
      "a stop while reducing takes the average that still comes, saves the round boundary and ends with done "
      "130") {
    cfg.train.rounds = 3;
    CATCH_CHECK(stop_while_held("reduce", 2, [this] { return communicator; }) ==
                "idle inner reducing outer_step saving inner reducing");
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() ==
                "idle inner reducing outer_step saving inner reducing outer_step saving stopping done");
    CATCH_CHECK(w->outer_rounds == std::vector<uint64_t>{1, 2});
    CATCH_CHECK(saved_rounds().back() == 2);
    CATCH_CHECK(seen({"w0 run"}) == strings{"w0 run 1", "w0 run 2"});
  }

  CATCH_SECTION(
      "a stop while reducing whose ring is cancelled keeps the previous checkpoint and ends with done 130") {
    cfg.train.rounds = 3;
    w->reduce_error = [](uint64_t round) {
      return round == 2 ? make_error(errc::cancelled, "ring cancelled") : caf::error{};
    };
    stop_while_held("reduce", 2, [this] { return communicator; });
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() == "idle inner reducing outer_step saving inner reducing stopping done");
    CATCH_CHECK(saved_rounds() == std::vector<uint64_t>{1});
    CATCH_CHECK(w->outer_rounds == std::vector<uint64_t>{1});
    CATCH_CHECK(seen({"save", "flush", "done"}) == strings{"save 1", "flush", "done 130"});
    CATCH_CHECK(
        logged("stopped during the all-reduce of round 2, of which no checkpoint exists; the newest "
               "stays: round 1, inner step"));
  }

  CATCH_SECTION("a stop while reducing names the newest checkpoint there is, not the round before") {
    cfg.train.rounds = 3;
    cfg.checkpoint.every_rounds = 5;  // none before the stop
    w->reduce_error = [](uint64_t round) {
      return round == 2 ? make_error(errc::cancelled, "ring cancelled") : caf::error{};
    };
    stop_while_held("reduce", 2, [this] { return communicator; });
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(saved_rounds().empty());
    CATCH_CHECK(logged("the newest stays: none yet (a rerun starts over)"));
  }

  CATCH_SECTION(
      "a stop during the outer step finishes the round, saves its boundary and ends with done 130") {
    cfg.train.rounds = 3;
    CATCH_CHECK(stop_while_held("outer", 2, [this] { return outer; }) ==
                "idle inner reducing outer_step saving inner reducing outer_step");
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() ==
                "idle inner reducing outer_step saving inner reducing outer_step saving stopping done");
    CATCH_CHECK(saved_rounds().back() == 2);
    CATCH_CHECK(seen({"w0 run"}) == strings{"w0 run 1", "w0 run 2"});
  }

  CATCH_SECTION("a stop while saving lets the snapshot go out and ends with done 130 at the round boundary") {
    cfg.train.rounds = 3;
    CATCH_CHECK(stop_while_held("outer_state", 1, [this] { return outer; }) ==
                "idle inner reducing outer_step saving");
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() == "idle inner reducing outer_step saving stopping done");
    CATCH_CHECK(saved_rounds().back() == 1);
    CATCH_CHECK(seen({"w0 run"}) == strings{"w0 run 1"});
  }

  CATCH_SECTION("a stop during the last evaluation lets the finished run end with done 0") {
    // The last round is saved before its final evaluation: an abort or a crash in it keeps the run.
    CATCH_CHECK(stop_while_held(
                    "eval", 0, [this] { return workers.at(0); },
                    [this] {
                      CATCH_CHECK(saved_rounds() == std::vector<uint64_t>{1, 2});
                    }) ==
                "idle inner reducing outer_step saving inner reducing outer_step saving evaluating");
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
    CATCH_CHECK(phases() ==
                "idle inner reducing outer_step saving inner reducing outer_step saving evaluating done");
    CATCH_CHECK(saved_rounds() == std::vector<uint64_t>{1, 2});
  }

  CATCH_SECTION("a stop before theta_0 is set ends with done 130 and says nothing was saved") {
    w->hold = hold_all("set");
    launch();
    CATCH_REQUIRE(phases() == "idle");
    stop();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() == "idle stopping done");
    CATCH_CHECK(saved_rounds().empty());
    CATCH_CHECK(
        logged("stopping before training began (theta_0 not yet set): nothing to save; newest "
               "checkpoint: none"));
    for (auto& wk : workers) release(wk, "set");  // the late replies start nothing
    CATCH_CHECK(seen({"w0 run"}).empty());
  }

  CATCH_SECTION("a stop while resuming saves the resumed round boundary and ends with done 130") {
    cfg.train.rounds = 3;
    w->hold = hold_all("load");
    launch(resume_snapshot(1));
    CATCH_INFO(log.str());
    CATCH_REQUIRE(phases() == "idle resuming");
    stop();
    for (auto& wk : workers) release(wk, "load");
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() == "idle resuming stopping done");
    CATCH_CHECK(seen({"outer", "w", "save", "done"}) == strings{"outer load", "w0 load", "w1 load",
                                                                "w0 state", "w1 state", "outer state",
                                                                "save 1", "done 130"});
    CATCH_REQUIRE(saved_rounds() == std::vector<uint64_t>{1});
    CATCH_CHECK(w->saved[0].step == 4);
    CATCH_CHECK(w->saved[0].theta[0].item<float>() == Approx(-0.15));
  }
}

CATCH_TEST_CASE_METHOD(
    coordinator_fixture,
    "lost peers, failed checkpoint writes and diverged snapshots end the run with their exit codes",
    "[integration][coordinator]") {
  CATCH_SECTION(
      "a lost ring peer without a stop fails the run with done 1 when the 600 ms grace ends in virtual "
      "time") {
    w->reduce_error = [](uint64_t round) {
      return round == 2 ? make_error(errc::peer_lost, "node b lost") : caf::error{};
    };
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(phases() == "idle inner reducing outer_step saving inner reducing");
    sched.advance_time(std::chrono::milliseconds(599));
    settle();
    CATCH_CHECK(w->codes.empty());
    sched.advance_time(std::chrono::milliseconds(1));
    settle();
    CATCH_REQUIRE(w->codes == std::vector<int>{1});
    CATCH_CHECK(phases() == "idle inner reducing outer_step saving inner reducing failed");
    CATCH_CHECK(logged("training failed in phase reducing"));
    CATCH_CHECK(logged("node b lost"));
    CATCH_CHECK(saved_rounds() == std::vector<uint64_t>{1});
    stop();  // too late: the run has ended
    CATCH_CHECK(w->codes.size() == 1);
  }

  CATCH_SECTION("a lost ring peer followed by a stop within the grace period ends as a stop with done 130") {
    w->reduce_error = [](uint64_t round) {
      return round == 2 ? make_error(errc::peer_lost, "node b lost") : caf::error{};
    };
    launch();
    CATCH_INFO(log.str());
    sched.advance_time(std::chrono::milliseconds(300));
    settle();
    stop();
    CATCH_CHECK(w->codes.empty());  // decided when the grace period ends
    sched.advance_time(std::chrono::milliseconds(300));
    settle();
    CATCH_REQUIRE(w->codes == std::vector<int>{130});
    CATCH_CHECK(phases() == "idle inner reducing outer_step saving inner reducing stopping done");
    CATCH_CHECK(saved_rounds() == std::vector<uint64_t>{1});  // no snapshot of round 2 exists
  }

  CATCH_SECTION("two failed checkpoint writes in a row end the run with done 3") {
    cfg.train.rounds = 4;
    w->save_error = [](uint64_t round, int) {
      return round <= 2 ? make_error(errc::io_error, "No space left on device") : caf::error{};
    };
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{3});
    CATCH_CHECK(seen({"save"}) == strings{"save 1", "save 2"});
    CATCH_CHECK(saved_rounds().empty());
    CATCH_CHECK(logged("stopping after 2 failed checkpoint writes in a row"));
    CATCH_CHECK(phases().substr(phases().size() - 7) == " failed");
    // Training waits for a lent boundary snapshot's write, so round 3 never starts.
    CATCH_CHECK(seen({"w0 run"}) == strings{"w0 run 1", "w0 run 2"});
  }

  CATCH_SECTION("one failed checkpoint write followed by a good one lets the run go on to done 0") {
    cfg.train.rounds = 3;
    w->save_error = [](uint64_t round, int) {
      return round == 1 ? make_error(errc::io_error, "No space left on device") : caf::error{};
    };
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{0});
    CATCH_CHECK(saved_rounds() == std::vector<uint64_t>{2, 3});
    CATCH_CHECK(logged("writing works again"));
  }

  CATCH_SECTION("a checkpointer that refuses a diverged snapshot fails the run with done 1") {
    cfg.train.rounds = 3;
    w->save_error = [](uint64_t round, int) {
      return round == 1 ? make_error(errc::diverged, "theta holds NaN") : caf::error{};
    };
    launch();
    CATCH_INFO(log.str());
    CATCH_REQUIRE(w->codes == std::vector<int>{1});
    CATCH_CHECK(saved_rounds().empty());
    CATCH_CHECK(logged("theta holds NaN"));
    CATCH_CHECK(seen({"save"}) == strings{"save 1"});
  }
}

CATCH_TEST_CASE_METHOD(coordinator_fixture,
                       "a move the state machine forbids (a second start while inner) fails the run with "
                       "done 1 naming both phases",
                       "[integration][coordinator]") {
  w->hold = hold_all("run", 1);
  launch();
  CATCH_INFO(log.str());
  CATCH_REQUIRE(phases() == "idle inner");
  auto second = sys.spawn(fake_main, w, coordinator);
  settle();
  CATCH_REQUIRE(w->codes == std::vector<int>{1});
  CATCH_CHECK(phases() == "idle inner failed");
  CATCH_CHECK(logged("the coordinator cannot go from inner to inner"));
  // The first round's results come after the run failed: nothing follows.
  const auto after = w->seen.size();
  for (auto& wk : workers) release(wk, "run");
  CATCH_CHECK(w->seen.size() == after);
  CATCH_CHECK(w->codes.size() == 1);
  caf::anon_send_exit(second, caf::exit_reason::kill);
}

// A reply that comes after the run ended: set_phase refuses the move and the caller stops there.
CATCH_TEST_CASE_METHOD(
    coordinator_fixture,
    "after a failure a late average is refused quietly and nothing more is asked of the peers",
    "[integration][coordinator]") {
  w->hold = hold_first("reduce", 1);
  launch();
  CATCH_INFO(log.str());
  CATCH_REQUIRE(phases() == "idle inner reducing");
  caf::anon_send_exit(workers.at(1), caf::exit_reason::kill);  // a worker dies: down -> failed
  settle();
  CATCH_REQUIRE(w->codes == std::vector<int>{1});
  CATCH_CHECK(phases() == "idle inner reducing failed");
  const auto after = w->seen.size();
  release(communicator, "reduce");
  CATCH_CHECK(logged("failed -> outer_step refused: the run has ended"));
  CATCH_CHECK(w->codes.size() == 1);
  CATCH_CHECK(std::vector<std::string>(w->seen.begin() + static_cast<std::ptrdiff_t>(after), w->seen.end()) ==
              strings{});
}

CATCH_TEST_CASE_METHOD(
    coordinator_fixture,
    "a round record says how long the coordinator spent in each phase since the one before",
    "[integration][coordinator]") {
  // Round 1's all-reduce is held: the coordinator waits in reducing while the clock runs.
  run_holding_first_reduce(300);
  std::vector<double> inner, reducing, outer;
  for (const auto& d : records_of("round")) {
    CATCH_REQUIRE(d.HasMember("inner_s"));
    CATCH_REQUIRE(d.HasMember("reducing_s"));
    CATCH_REQUIRE(d.HasMember("outer_step_s"));
    inner.push_back(d["inner_s"].GetDouble());
    reducing.push_back(d["reducing_s"].GetDouble());
    outer.push_back(d["outer_step_s"].GetDouble());
  }
  CATCH_REQUIRE(reducing.size() == 2);
  // The held all-reduce's wait is counted in the phase that waited for it, and in round 1's record only (the
  // fakes answer at once: the other phases take a tiny part of the wait).
  CATCH_CHECK(reducing[0] >= 0.3);
  CATCH_CHECK(inner[0] < reducing[0]);
  CATCH_CHECK(outer[0] < reducing[0]);
  CATCH_CHECK(reducing[1] < reducing[0]);
}

CATCH_TEST_CASE_METHOD(
    coordinator_fixture,
    "a worker record splits its idle time into theta's load, the pseudo-gradient, the gaps "
    "between steps and the boundary",
    "[integration][coordinator]") {
  // Round 1's all-reduce is held: its wall time outside the workers' rounds is at least the hold.
  run_holding_first_reduce(300);
  const auto workers = records_of("worker");
  CATCH_CHECK(workers.size() == static_cast<size_t>(cfg.train.rounds * cfg.train.workers));
  for (const auto& d : workers) {
    CATCH_INFO("round " << d["round"].GetUint64() << ", worker " << d["worker"].GetInt64());
    // The fakes report no steps: the worker's round (0.05 s) is load 0.01, the pseudo-gradient 0.02 and
    // gaps 0.02, once a round (summed over the round's run requests, then started again).
    CATCH_CHECK(d["load_s"].GetDouble() == Approx(0.01));
    CATCH_CHECK(d["delta_s"].GetDouble() == Approx(0.02));
    CATCH_CHECK(d["gaps_s"].GetDouble() == Approx(0.02));
    if (d["round"].GetUint64() != 1) continue;
    CATCH_CHECK(d["boundary_s"].GetDouble() >= 0.3 - 0.05);
    const double parts = d["load_s"].GetDouble() + d["delta_s"].GetDouble() + d["gaps_s"].GetDouble() +
                         d["boundary_s"].GetDouble();
    CATCH_CHECK(parts == Approx(d["idle_s"].GetDouble()));
  }
}
