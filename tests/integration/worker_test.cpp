// The worker actor's answers whose copies are still in flight (issue 38), on the CPU device through the
// device-generic streams a GPU node runs: a state asked for is answered once its copies are done, the worker
// serving meanwhile; a copy that fails answers with its error and the worker lives on. The stage's side
// stream is held at a gate (tests/support/stream_gate.hpp), so a copy surely is in flight.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/run_context.hpp"
#include "actors/worker.hpp"
#include "models/device_stream.hpp"
#include "models/gpt.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/type_ids.hpp"
#include "tests/support/stream_gate.hpp"

using namespace longwave;
using namespace longwave::runtime;

namespace {

// A safety net only: a broken worker fails the test instead of hanging it. Nothing waits for it.
constexpr auto patience = std::chrono::minutes(5);

/// Takes the worker's step reports and nothing else.
coordinator_actor::behavior_type report_sink() {
  return {
      [](start_atom) {},
      [](stop_atom) {},
      [](stop_atom, done_atom) {},
      [](hold_atom) -> uint64_t { return 0; },
      [](stop_atom, uint64_t) {},
      [](hold_atom, uint64_t) {},
      [](hold_atom, done_atom) {},
      [](report_atom, const step_report&) {},
      [](lost_atom, const ring_label&, const caf::error&) {},
      [](lost_atom, const caf::error&) {},
      [](merge_atom, const merge_order&) {},
  };
}

/// An error where a reply was expected fails the test, naming it.
const auto fail_on_error = [](caf::error& e) { CATCH_FAIL(describe(e)); };

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a, b);
}

/// One CPU worker whose stage runs on streams the test holds.
struct worker_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<models::device_stream> compute = models::device_stream::compute(c10::Device("cpu"));
  std::shared_ptr<models::device_stream> side = models::device_stream::side(c10::Device("cpu"));
  worker_actor worker;
  models::model_spec spec = models::preset_spec("tiny", 64, 16);

  worker_fixture() {
    cfg.add_message_types<caf::id_block::longwave>();
    sys = std::make_unique<caf::actor_system>(cfg);
    auto ctx = std::make_shared<actors::run_context>();
    ctx->cfg.model.seq_len = spec.seq_len;
    ctx->cfg.train.workers = 1;
    ctx->cfg.train.batch_size = 4;
    ctx->cfg.train.inner_steps = 2;
    ctx->cfg.train.rounds = 10;
    ctx->spec = spec;
    ctx->inner = actors::make_inner_options(ctx->cfg);
    ctx->inner.stage_delta = true;  // the GPU's way out: a device buffer, a side stream, a host buffer
    ctx->inner.stage_compute = compute;
    ctx->inner.stage_side = side;
    std::vector<uint16_t> t(20000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 5) % 64);
    ctx->train_tokens = std::make_shared<const std::vector<uint16_t>>(std::move(t));
    ctx->val_tokens = ctx->train_tokens;
    worker = actors::spawn_worker(*sys, ctx, 0, sys->spawn(report_sink));
  }

  ~worker_fixture() {
    caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
    worker = nullptr;
    sys.reset();  // joins the worker before the streams it holds go
  }

  at::Tensor theta(uint64_t seed) const { return models::gpt::init_flat(spec, seed); }

  /// A round of `h` steps from theta; its pseudo-gradient (or the round's error, a failed check).
  round_result run(uint64_t round, const at::Tensor& theta, int64_t h) {
    caf::scoped_actor self{*sys};
    round_result out;
    self->request(worker, patience, run_atom_v, round, theta, h, true, int64_t{-1})
        .receive([&](round_result& r) { out = std::move(r); },
                 [&](caf::error& e) { CATCH_FAIL("round " << round << ": " << describe(e)); });
    return out;
  }

  /// The state after a first round of two steps, asked for with no copy in flight.
  replica_state after_first_round() {
    run(1, theta(1), 2);
    auto s = state(false);
    CATCH_REQUIRE(s);
    return *s;
  }

  /// The state as (state, lend) answers it: a deep copy (lend = false) or the live buffers.
  caf::expected<replica_state> state(bool lend) {
    caf::scoped_actor self{*sys};
    caf::expected<replica_state> out{caf::error{}};
    self->request(worker, patience, state_atom_v, lend)
        .receive([&](replica_state& r) { out = std::move(r); }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

void check_same_state(const replica_state& a, const replica_state& b) {
  CATCH_CHECK(a.adam_steps == b.adam_steps);
  CATCH_CHECK(a.sampler_position == b.sampler_position);
  CATCH_CHECK(same_bits(a.master, b.master));
  CATCH_CHECK(same_bits(a.exp_avg, b.exp_avg));
  CATCH_CHECK(same_bits(a.exp_avg_sq, b.exp_avg_sq));
}

/// Nothing has come back to `asker` yet: its request, which the worker took before a message whose reply
/// came since (one mailbox, in order), waits for its copies.
bool unanswered(caf::scoped_actor& asker) {
  return asker->mailbox().empty();
}

/// Waits until `s` is blocked on an event (the fence of a copy the test holds).
void until_waiting(const models::device_stream& s) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!s.waiting() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  CATCH_REQUIRE(s.waiting());
}

}  // namespace

CATCH_TEST_CASE(
    "a worker answers a state asked for between rounds once its copies are done, and serves meanwhile",
    "[integration][worker][stage]") {
  worker_fixture f;
  const replica_state before = f.after_first_round();
  CATCH_CHECK(before.adam_steps == 2);
  test::gate g;
  g.hold(*f.side);
  caf::scoped_actor asker{*f.sys};
  auto pending = asker->request(f.worker, patience, state_atom_v);
  // The copy is held: the worker still answers, and what it is asked to load changes no copy in flight.
  caf::scoped_actor other{*f.sys};
  other->request(f.worker, patience, set_atom_v, f.theta(2))
      .receive([](bool ok) { CATCH_CHECK(ok); }, fail_on_error);
  CATCH_CHECK(unanswered(asker));
  g.open();  // the worker looks again between rounds (copied) and answers
  pending.receive([&](replica_state& r) { check_same_state(r, before); }, fail_on_error);
  auto now = f.state(false);
  CATCH_REQUIRE(now);
  CATCH_CHECK(same_bits(now->master, f.theta(2)));
}

CATCH_TEST_CASE(
    "a state asked for before a round is answered once its copies are done: the round loads at once and its "
    "first update waits for them",
    "[integration][worker][stage]") {
  worker_fixture f;
  const replica_state before = f.after_first_round();
  test::gate g;
  g.hold(*f.side);
  caf::scoped_actor asker{*f.sys}, runner{*f.sys};
  auto pending = asker->request(f.worker, patience, state_atom_v);
  auto round =
      runner->request(f.worker, patience, run_atom_v, uint64_t{2}, f.theta(2), int64_t{2}, true, int64_t{-1});
  until_waiting(*f.compute);  // the round's first update waits for the moments' copies
  CATCH_CHECK(unanswered(asker));
  g.open();
  // Answered by the step that follows the copies (inner_step looks), before the round ends.
  pending.receive([&](replica_state& r) { check_same_state(r, before); }, fail_on_error);
  round.receive(
      [&](round_result& r) {
        CATCH_CHECK(r.round == 2);
        CATCH_REQUIRE(r.delta.defined());
        CATCH_CHECK(r.delta.abs().max().item<float>() > 0);
      },
      fail_on_error);
  auto after = f.state(false);
  CATCH_REQUIRE(after);
  CATCH_CHECK(after->adam_steps == 4);
  CATCH_CHECK_FALSE(same_bits(after->master, before.master));
}

CATCH_TEST_CASE("two states asked for while copies are in flight are answered in order, each of its moment",
                "[integration][worker][stage]") {
  worker_fixture f;
  const replica_state first_state = f.after_first_round();
  test::gate g;
  g.hold(*f.side);
  caf::scoped_actor a{*f.sys}, b{*f.sys};
  auto first = a->request(f.worker, patience, state_atom_v);
  // The second request, after a load, waits for the first's copies (answer_copy(wait)) before it copies its
  // own moment, whether it reaches the worker before the gate opens or after.
  caf::scoped_actor other{*f.sys};
  other->request(f.worker, patience, set_atom_v, f.theta(3))
      .receive([](bool ok) { CATCH_CHECK(ok); }, fail_on_error);
  CATCH_CHECK(unanswered(a));
  auto second = b->request(f.worker, patience, state_atom_v);
  g.open();
  first.receive([&](replica_state& r) { check_same_state(r, first_state); }, fail_on_error);
  second.receive(
      [&](replica_state& r) {
        CATCH_CHECK(same_bits(r.master, f.theta(3)));
        CATCH_CHECK(same_bits(r.exp_avg, first_state.exp_avg));
      },
      fail_on_error);
}

CATCH_TEST_CASE(
    "a copy that fails answers its state request with the error that names the worker, and the "
    "worker lives on and its next round fails with that error",
    "[integration][worker][stage]") {
  worker_fixture f;
  f.run(1, f.theta(1), 2);
  test::gate g;
  g.hold(*f.side);
  f.side->run([] { throw std::runtime_error("injected copy failure"); });
  caf::scoped_actor asker{*f.sys};
  auto pending = asker->request(f.worker, patience, state_atom_v);
  g.open();
  pending.receive([](replica_state&) { CATCH_FAIL("a failed copy answered a state"); },
                  [](caf::error& e) {
                    const auto text = describe(e);
                    CATCH_CHECK(text.find("worker 0") != std::string::npos);
                    CATCH_CHECK(text.find("injected copy failure") != std::string::npos);
                  });
  // A deep copy goes through the failed stream: an error, not a dead worker.
  auto copied = f.state(false);
  CATCH_REQUIRE_FALSE(copied);
  CATCH_CHECK(describe(copied.error()).find("injected copy failure") != std::string::npos);
  // The live buffers need no copy: the worker still answers.
  auto lent = f.state(true);
  CATCH_REQUIRE(lent);
  CATCH_CHECK(lent->adam_steps == 2);
  // The round's pseudo-gradient leaves through the failed stream: its reply carries the error.
  caf::scoped_actor runner{*f.sys};
  runner->request(f.worker, patience, run_atom_v, uint64_t{2}, f.theta(2), int64_t{2}, true, int64_t{-1})
      .receive(
          [](round_result&) { CATCH_FAIL("a round ran past a failed copy"); },
          [](caf::error& e) { CATCH_CHECK(describe(e).find("injected copy failure") != std::string::npos); });
}

CATCH_TEST_CASE("out of memory, a run is advised only the knobs that can still go lower",
                "[integration][worker]") {
  config::train_config cfg;
  cfg.train.batch_size = 1;
  cfg.train.workers = 1;
  const auto alone = actors::memory_advice(cfg, 128, false);
  CATCH_CHECK(alone ==
              "lower model.seq_len, or use a smaller model.preset or shape (model.dim, model.layers, ...)");
  cfg.train.batch_size = 8;
  cfg.train.workers = 2;
  cfg.train.micro_batches = 2;
  CATCH_CHECK(actors::memory_advice(cfg, 1, false) ==
              "lower train.batch_size, lower train.workers, or use a smaller model.preset or shape "
              "(model.dim, model.layers, ...)");
  CATCH_CHECK(
      actors::memory_advice(cfg, 128, true)
          .rfind(
              "lower train.batch_size, raise train.micro_batches (now 2), use fewer workers per GPU, lower "
              "model.seq_len",
              0) == 0);
  cfg.train.micro_batches = 8;  // one sequence a micro-batch already
  CATCH_CHECK(actors::memory_advice(cfg, 128, true).find("micro_batches") == std::string::npos);
}
