// The outer step through the real communicator and outer-optimizer actors, against a hand-computed
// Nesterov sequence.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <utility>
#include <vector>

#include "actors/communicator.hpp"
#include "actors/outer_optimizer.hpp"
#include "comm/reduction.hpp"
#include "models/outer_sgd.hpp"
#include "runtime/messages/type_ids.hpp"

using namespace longwave;
using namespace longwave::runtime;

CATCH_TEST_CASE("three outer steps of two workers follow the hand-computed Nesterov sequence",
                "[actors][outer]") {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::longwave>();
  caf::actor_system sys{cfg};
  config::outer_section outer_cfg;  // defaults: lr 0.7, momentum 0.9, nesterov
  auto comm = actors::spawn_communicator(sys);
  auto outer = actors::spawn_outer_optimizer(sys, outer_cfg, at::tensor({1.0f, -2.0f}));
  caf::scoped_actor self{sys};
  // Pseudo-gradients of worker a and b per round; the second element is the first negated.
  const float da[3] = {0.2f, 0.1f, -0.5f}, db[3] = {0.4f, -0.1f, -0.3f};
  // By hand: mean delta 0.3, 0.0, -0.4.
  //   b1 = 0.3            theta1 = 1 - 0.7*(0.3 + 0.27)       = 0.601
  //   b2 = 0.27           theta2 = 0.601 - 0.7*(0 + 0.243)    = 0.4309
  //   b3 = 0.243 - 0.4    theta3 = 0.4309 - 0.7*(-0.4 - 0.1413) = 0.80981
  const double expected[3] = {0.601, 0.4309, 0.80981};
  for (int r = 0; r < 3; ++r) {
    std::vector<at::Tensor> parts{at::tensor({da[r], -da[r]}), at::tensor({db[r], -db[r]})};
    at::Tensor avg;
    self->request(comm, std::chrono::seconds(10), reduce_atom_v, reduce_request{{uint64_t(r + 1), 0}, parts})
        .receive([&](reduced& r) { avg = r.avg; }, [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    at::Tensor theta;
    self->request(outer, std::chrono::seconds(10), outer_atom_v, ring_label{uint64_t(r + 1), 0}, avg)
        .receive([&](at::Tensor& t) { theta = t.clone(); },
                 [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    CATCH_CHECK(std::abs(theta[0].item<double>() - expected[r]) < 1e-6);
    CATCH_CHECK(std::abs(theta[1].item<double>() - (-2.0 - (expected[r] - 1.0))) < 1e-6);
  }
  // A stale round is refused, and theta is unchanged.
  self->request(outer, std::chrono::seconds(10), outer_atom_v, ring_label{2, 0}, at::tensor({1.0f, 1.0f}))
      .receive([&](at::Tensor&) { CATCH_FAIL("stale round accepted"); },
               [&](caf::error& e) { CATCH_CHECK(e.code() == static_cast<uint8_t>(errc::stale_round)); });
  // Contributions of different sizes are refused by the communicator.
  self->request(comm, std::chrono::seconds(10), reduce_atom_v,
                reduce_request{{4, 0}, std::vector<at::Tensor>{at::ones({2}), at::ones({3})}})
      .receive([&](reduced&) { CATCH_FAIL("mismatched sizes accepted"); },
               [&](caf::error& e) { CATCH_CHECK(e.code() == static_cast<uint8_t>(errc::malformed_frame)); });
  self->send_exit(comm, caf::exit_reason::user_shutdown);
  self->send_exit(outer, caf::exit_reason::user_shutdown);
}

CATCH_TEST_CASE(
    "a delayed step prepared ahead is the step bit for bit, the state and every theta handed out stay as "
    "they were meanwhile, and another average drops it",
    "[actors][outer]") {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::longwave>();
  caf::actor_system sys{cfg};
  config::outer_section outer_cfg;  // lr 0.7, momentum 0.9, nesterov
  const auto theta0 = at::randn({3000});
  auto plain = actors::spawn_outer_optimizer(sys, outer_cfg, theta0.clone());
  auto ahead = actors::spawn_outer_optimizer(sys, outer_cfg, theta0.clone());
  caf::scoped_actor self{sys};
  auto step = [&](const runtime::outer_actor& a, uint64_t r, const at::Tensor& avg) {
    at::Tensor out;
    self->request(a, std::chrono::seconds(10), outer_atom_v, ring_label{r, 0}, avg)
        .receive([&](at::Tensor& t) { out = t; }, [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    return out;
  };
  auto state = [&](const runtime::outer_actor& a) {
    outer_snapshot out;
    self->request(a, std::chrono::seconds(10), state_atom_v, false)
        .receive([&](outer_snapshot& o) { out = std::move(o); },
                 [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    return out;
  };
  at::Tensor held = theta0;  // the theta a worker trains from (not a clone: the actor's own tensor)
  for (uint64_t r = 1; r <= 5; ++r) {
    const auto avg = at::randn({3000}) * 0.01;
    const auto before = state(ahead);
    const auto held_bits = held.clone();
    self->send(ahead, prepare_atom_v, ring_label{r, 0}, avg);
    const auto mid = state(ahead);  // after the prepare: still the state before the step
    CATCH_CHECK(at::equal(mid.theta, before.theta));
    CATCH_CHECK(mid.momentum.defined() == before.momentum.defined());
    if (mid.momentum.defined()) CATCH_CHECK(at::equal(mid.momentum, before.momentum));
    CATCH_CHECK(at::equal(held, held_bits));  // a theta handed out earlier is not written
    const auto want = step(plain, r, avg).clone();
    const void* was = held.data_ptr();
    held = step(ahead, r, avg);
    CATCH_CHECK(held.data_ptr() != was);  // the prepared theta swapped in (the plain step writes in place)
    CATCH_CHECK(at::equal(held, want));
    CATCH_CHECK(at::equal(state(ahead).momentum, state(plain).momentum));
  }
  // Prepared with another average, or for another round: dropped, and the step computed as always.
  const auto avg6 = at::randn({3000}) * 0.01;
  self->send(ahead, prepare_atom_v, ring_label{6, 0}, at::randn({3000}));
  CATCH_CHECK(at::equal(step(ahead, 6, avg6), step(plain, 6, avg6)));
  const auto avg7 = at::randn({3000}) * 0.01;
  self->send(ahead, prepare_atom_v, ring_label{8, 0}, avg7);
  CATCH_CHECK(at::equal(step(ahead, 7, avg7), step(plain, 7, avg7)));
  // A prepare of a stale round or of the wrong size changes nothing, and the step still refuses it.
  self->send(ahead, prepare_atom_v, ring_label{3, 0}, avg7);
  self->send(ahead, prepare_atom_v, ring_label{9, 0}, at::ones({5}));
  CATCH_CHECK(at::equal(state(ahead).theta, state(plain).theta));
  self->request(ahead, std::chrono::seconds(10), outer_atom_v, ring_label{9, 0}, at::ones({5}))
      .receive([&](at::Tensor&) { CATCH_FAIL("a step of the wrong size accepted"); },
               [&](caf::error& e) { CATCH_CHECK(e.code() == static_cast<uint8_t>(errc::malformed_frame)); });
  for (auto* a : {&plain, &ahead}) self->send_exit(*a, caf::exit_reason::user_shutdown);
}

CATCH_TEST_CASE("outer SGD with momentum 0 and lr 1 lands exactly on theta minus delta", "[models][outer]") {
  models::outer_sgd sgd(1.0, 0.0, true);
  auto theta = at::tensor({3.0f, 4.0f});
  sgd.step(theta, at::tensor({1.0f, -1.0f}));
  CATCH_CHECK(theta[0].item<float>() == 2.0f);
  CATCH_CHECK(theta[1].item<float>() == 5.0f);
}

CATCH_TEST_CASE("outer SGD with negative heavy-ball momentum follows the hand-computed sequence",
                "[models][outer]") {
  // lr 0.5, mu -0.5, heavy ball: b1 = d1, theta1 = theta0 - b1/2; b2 = -b1/2 + d2, theta2 = theta1 - b2/2.
  models::outer_sgd sgd(0.5, -0.5, false);
  auto theta = at::tensor({4.0f, -2.0f});
  sgd.step(theta, at::tensor({2.0f, 1.0f}));  // b1 = (2, 1), theta1 = (3, -2.5)
  CATCH_CHECK(theta[0].item<float>() == 3.0f);
  CATCH_CHECK(theta[1].item<float>() == -2.5f);
  sgd.step(theta, at::tensor({2.0f, 1.0f}));  // b2 = (-1, -0.5) + (2, 1) = (1, 0.5), theta2 = (2.5, -2.75)
  CATCH_CHECK(sgd.momentum_buffer()[0].item<float>() == 1.0f);
  CATCH_CHECK(theta[0].item<float>() == 2.5f);
  CATCH_CHECK(theta[1].item<float>() == -2.75f);
}

CATCH_TEST_CASE(
    "delayed Nesterov applies each merge at once and its momentum every N-th, as computed by hand",
    "[models][outer][async]") {
  // lr 0.5, mu 0.5, N 2, theta 1, pseudo-gradients 0.4, 0.2, -0.2, 0.6 (each merge: theta -= lr * g / N):
  //   1: theta = 1 - 0.1 = 0.9, buf = 0.4
  //   2: theta = 0.9 - 0.05 = 0.85; m = 0 + (0.4 + 0.2) / 2 = 0.3; theta -= 0.25 * 0.3: 0.775
  //   3: theta = 0.775 + 0.05 = 0.825, buf = -0.2
  //   4: theta = 0.825 - 0.15 = 0.675; m = 0.15 + (-0.2 + 0.6) / 2 = 0.35; theta -= 0.25 * 0.35: 0.5875
  models::delayed_nesterov dn(0.5, 0.5, 2);
  auto theta = at::tensor({1.0f});
  const float g[4] = {0.4f, 0.2f, -0.2f, 0.6f};
  const double expected[4] = {0.9, 0.775, 0.825, 0.5875}, momentum[4] = {0, 0.3, 0.3, 0.35};
  for (int k = 0; k < 4; ++k) {
    const double moved = dn.step(theta, at::tensor({g[k]}));
    CATCH_CHECK(theta[0].item<float>() == Approx(expected[k]).epsilon(1e-6));
    CATCH_CHECK(dn.momentum_buffer()[0].item<float>() == Approx(momentum[k]).margin(1e-7));
    CATCH_CHECK(moved == Approx(std::abs(expected[k] - (k ? expected[k - 1] : 1.0))).epsilon(1e-5));
  }
  CATCH_CHECK(dn.merges() == 4);
  CATCH_CHECK(dn.period_buffer()[0].item<float>() == 0.0f);  // emptied at each fold
}

CATCH_TEST_CASE("delayed Nesterov counts a merge's contributions as arrivals, as computed by hand",
                "[models][outer][async]") {
  // lr 0.5, mu 0.5, N 4, theta 1; merges (mean g, k contributions): (0.4, 3), (0.2, 2), (-0.2, 1), (0.6, 3).
  // Each merge: theta -= lr * k * g / N and buf += k g; a fold once N arrivals are in: m <- mu m + buf / a.
  //   1: theta = 1 - 0.15 = 0.85, buf = 1.2, a = 3
  //   2: theta = 0.85 - 0.05 = 0.8; a = 5: m = (1.2 + 0.4) / 5 = 0.32; theta -= 0.25 * 0.32: 0.72
  //   3: theta = 0.72 + 0.025 = 0.745, buf = -0.2, a = 1
  //   4: theta = 0.745 - 0.225 = 0.52; a = 4: m = 0.16 + (-0.2 + 1.8) / 4 = 0.56; theta -= 0.14: 0.38
  models::delayed_nesterov dn(0.5, 0.5, 4);
  auto theta = at::tensor({1.0f});
  const float g[4] = {0.4f, 0.2f, -0.2f, 0.6f};
  const int64_t k[4] = {3, 2, 1, 3}, arrivals[4] = {3, 0, 1, 0};
  const double expected[4] = {0.85, 0.72, 0.745, 0.38}, momentum[4] = {0, 0.32, 0.32, 0.56};
  for (int i = 0; i < 4; ++i) {
    const double moved = dn.step(theta, at::tensor({g[i]}), k[i]);
    CATCH_CHECK(theta[0].item<float>() == Approx(expected[i]).epsilon(1e-6));
    CATCH_CHECK(dn.momentum_buffer()[0].item<float>() == Approx(momentum[i]).margin(1e-7));
    CATCH_CHECK(dn.arrivals() == arrivals[i]);
    CATCH_CHECK(moved == Approx(std::abs(expected[i] - (i ? expected[i - 1] : 1.0))).epsilon(1e-5));
  }
  CATCH_CHECK(dn.merges() == 4);
}

CATCH_TEST_CASE("delayed Nesterov takes a merge of no arrivals (all lost) as a version that moves nothing",
                "[models][outer][async]") {
  models::delayed_nesterov dn(0.5, 0.5, 2);
  auto theta = at::tensor({1.0f});
  dn.step(theta, at::tensor({0.4f}), 1);  // theta 0.9, buf 0.4, a 1
  const auto m = dn.momentum_buffer().clone();
  CATCH_CHECK(dn.step(theta, at::tensor({0.0f}), 0) == 0);
  CATCH_CHECK(theta[0].item<float>() == Approx(0.9).epsilon(1e-6));
  CATCH_CHECK(dn.arrivals() == 1);
  CATCH_CHECK(at::equal(dn.momentum_buffer(), m));
  CATCH_CHECK(dn.merges() == 2);
}

CATCH_TEST_CASE("the outer actor takes an async merge of no arrivals, and refuses a negative count",
                "[actors][outer][async]") {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::longwave>();
  caf::actor_system sys{cfg};
  actors::outer_policy policy;
  policy.dn_period = 2;
  auto outer =
      actors::spawn_outer_optimizer(sys, config::outer_section{}, at::tensor({1.0f, -2.0f}), {}, policy);
  caf::scoped_actor self{sys};
  auto merge = [&](uint64_t version, int64_t arrivals) {
    caf::expected<at::Tensor> out = caf::error{};
    self->request(outer, std::chrono::seconds(10), merge_atom_v, version, at::tensor({0.5f, 0.5f}), arrivals)
        .receive([&](at::Tensor& t) { out = t.clone(); }, [&](caf::error& e) { out = e; });
    return out;
  };
  const auto v1 = merge(1, 1);
  CATCH_REQUIRE(v1);
  const auto v2 = merge(2, 0);  // every contributor was lost before the all-reduce: nothing moves
  CATCH_REQUIRE(v2);
  CATCH_CHECK(at::equal(*v1, *v2));
  const auto bad = merge(3, -1);
  CATCH_REQUIRE_FALSE(bad);
  CATCH_CHECK(bad.error().code() == static_cast<uint8_t>(errc::invalid_config));
  self->send_exit(outer, caf::exit_reason::user_shutdown);
}

CATCH_TEST_CASE("delayed Nesterov with period 1 is the outer Nesterov step", "[models][outer][async]") {
  models::delayed_nesterov dn(0.7, 0.9, 1);
  models::outer_sgd sgd(0.7, 0.9, true);
  auto a = at::randn({1000});
  auto b = a.clone();
  for (int k = 0; k < 5; ++k) {
    auto g = at::randn({1000}) * 0.1;
    dn.step(a, g);
    sgd.step(b, g);
  }
  CATCH_CHECK(!dn.period_buffer().defined());  // N = 1 keeps no buffer
  CATCH_CHECK(at::allclose(a, b, 1e-5, 1e-6));
  CATCH_CHECK(at::allclose(dn.momentum_buffer(), sgd.momentum_buffer(), 1e-5, 1e-6));
}

CATCH_TEST_CASE("the outer steps spread over threads give the same bits and norms on one thread or four",
                "[models][outer]") {
  // Several chunks of the steps' work and a ragged last one, on fragments too.
  const int64_t n = 3 * (int64_t{1} << 18) + 12345;
  const auto theta0 = at::randn({n});
  std::vector<at::Tensor> deltas;
  for (int k = 0; k < 3; ++k) deltas.push_back(at::randn({n}) * 0.01);
  const models::flat_ranges ranges{{7, 300000}, {400000, n - 400000}};
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    std::vector<at::Tensor> out;
    std::vector<double> norms;
    for (const bool nesterov : {true, false}) {
      models::outer_sgd sgd(0.7, 0.9, nesterov);
      auto theta = theta0.clone();
      for (const auto& d : deltas) norms.push_back(sgd.step(theta, d));
      out.push_back(theta);
      out.push_back(sgd.momentum_buffer());
    }
    models::outer_sgd frag(0.7, 0.9, true);
    auto theta = theta0.clone();
    const auto packed = at::cat({deltas[0].narrow(0, 0, 300000), deltas[0].narrow(0, 0, n - 400000)});
    norms.push_back(frag.step(theta, packed, ranges));
    out.push_back(theta);
    models::delayed_nesterov dn(0.7, 0.9, 2);
    auto a = theta0.clone();
    for (const auto& d : deltas) norms.push_back(dn.step(a, d, 1));
    out.push_back(a);
    out.push_back(dn.momentum_buffer());
    return std::make_pair(out, norms);
  };
  const int before = at::get_num_threads();
  const auto one = run(1);
  const auto four = run(4);
  at::set_num_threads(before);
  CATCH_REQUIRE(one.first.size() == four.first.size());
  for (size_t i = 0; i < one.first.size(); ++i) CATCH_CHECK(at::equal(one.first[i], four.first[i]));
  CATCH_CHECK(one.second == four.second);
  // And the Nesterov step is ATen's op for op: b = mu b + d, theta -= lr (d + mu b).
  auto theta = theta0.clone(), b = deltas[0].clone();
  theta.sub_(deltas[0] + b * 0.9F, 0.7);
  CATCH_CHECK(at::allclose(
      theta,
      [&] {
        models::outer_sgd sgd(0.7, 0.9, true);
        auto t = theta0.clone();
        sgd.step(t, deltas[0]);
        return t;
      }(),
      0, 1e-6));
}

CATCH_TEST_CASE("CGAD's age scale: 1 when fresh, a cosine gate times exp(-alpha tau), 0 from the cutoff",
                "[models][outer][async]") {
  CATCH_CHECK(models::cgad_scale(0, 0.1, 4) == 1.0);
  // tau 2 of 4: gate 0.5 (1 + cos(pi / 2)) = 0.5, exp(-0.2) = 0.8187307531
  CATCH_CHECK(models::cgad_scale(2, 0.1, 4) == Approx(0.5 * 0.8187307531).epsilon(1e-9));
  CATCH_CHECK(models::cgad_scale(1, 0.0, 4) == Approx(0.5 * (1 + 0.7071067812)).epsilon(1e-9));
  CATCH_CHECK(models::cgad_scale(4, 0.1, 4) == 0.0);
  CATCH_CHECK(models::cgad_scale(9, 0.1, 4) == 0.0);
}

CATCH_TEST_CASE("fragments cover every parameter once, strided or sequential", "[models][outer]") {
  auto spec = models::preset_spec("tiny", 256, 64);  // 4 layers
  const int64_t n = models::closed_form_param_count(spec);
  for (bool strided : {true, false}) {
    for (int64_t p : {1, 2, 3, 4}) {
      CATCH_INFO((strided ? "strided" : "sequential") << " P=" << p);
      auto frags = models::fragment_ranges(spec, p, strided);
      CATCH_REQUIRE(frags.size() == static_cast<size_t>(p));
      std::vector<int> seen(static_cast<size_t>(n), 0);
      for (const auto& f : frags) {
        CATCH_CHECK(!f.empty());
        for (size_t i = 0; i < f.size(); ++i) {
          if (i > 0) CATCH_CHECK(f[i].first > f[i - 1].first + f[i - 1].second);  // sorted, merged
          for (int64_t k = f[i].first; k < f[i].first + f[i].second; ++k) seen[static_cast<size_t>(k)]++;
        }
      }
      CATCH_CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  }
  // Strided P=2: layers 0 and 2 (with the embedding) in fragment 0; layers 1 and 3 (with the final norm)
  // in 1. Sequential P=2: layers 0-1 with the embedding, then 2-3 with the final norm, each one range.
  auto seq = models::fragment_ranges(spec, 2, false);
  CATCH_CHECK(seq[0].size() == 1);
  CATCH_CHECK(seq[1].size() == 1);
  auto str = models::fragment_ranges(spec, 2, true);
  CATCH_CHECK(str[0].size() == 2);  // [emb, layer 0], [layer 2]
  CATCH_CHECK(str[1].size() == 2);  // [layer 1], [layer 3, final norm]
  CATCH_CHECK(str[1].back().first + str[1].back().second == n);
}

CATCH_TEST_CASE("an outer step on fragments moves only their ranges and equals the full step on all of them",
                "[models][outer]") {
  const models::flat_ranges all{{0, 6}}, part{{1, 2}, {4, 1}};
  auto theta0 = at::tensor({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f});
  auto d1 = at::tensor({0.5f, -0.25f, 1.0f, 2.0f, -1.0f, 0.125f});
  auto d2 = at::tensor({-0.5f, 0.75f, 0.5f, 1.0f, 3.0f, -2.0f});
  // All ranges: bit-identical to the plain step, over two steps (momentum carried).
  models::outer_sgd full(0.7, 0.9, true), frag(0.7, 0.9, true);
  auto a = theta0.clone(), b = theta0.clone();
  for (const auto& d : {d1, d2}) {
    full.step(a, d);
    frag.step(b, d, all);
    CATCH_CHECK(at::equal(a, b));
  }
  CATCH_CHECK(at::equal(full.momentum_buffer(), frag.momentum_buffer()));
  // Part: values outside the ranges and their momentum stay; inside, the hand-computed Nesterov step.
  models::outer_sgd some(0.5, 0.9, true);
  auto c = theta0.clone();
  const auto dp = at::tensor({0.2f, 0.4f, -0.6f});  // for indices 1, 2, 4
  some.step(c, dp, part);
  // First step: b = d, theta -= lr * (d + mu * d) = lr * 1.9 * d.
  const float want[6] = {1.0f, 2.0f - 0.95f * 0.2f, 3.0f - 0.95f * 0.4f, 4.0f, 5.0f + 0.95f * 0.6f, 6.0f};
  for (int i = 0; i < 6; ++i) CATCH_CHECK(std::abs(c[i].item<float>() - want[i]) < 1e-6);
  CATCH_CHECK(some.momentum_buffer()[0].item<float>() == 0.0f);
  CATCH_CHECK(std::abs(some.momentum_buffer()[4].item<float>() + 0.6f) < 1e-7);
}

namespace {

/// One process's communicator with int8 and error feedback: one node on a ring of one rank, which quantizes
/// exactly as it would for the wire. reduce() answers a label's average (weight as reduce_request's).
struct int8_feedback {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  runtime::communicator_actor actor;
  caf::scoped_actor self;

  int8_feedback() : sys((cfg.add_message_types<caf::id_block::longwave>(), cfg)), actor(spawn()), self(sys) {}
  ~int8_feedback() { self->send_exit(actor, caf::exit_reason::user_shutdown); }

  runtime::communicator_actor spawn() {
    actors::communicator_options opts;
    opts.reduction.dtype = comm::wire_dtype::int8;
    opts.reduction.error_feedback = true;
    return actors::spawn_communicator(sys, opts);
  }

  at::Tensor reduce(uint64_t round, uint32_t fragment, const at::Tensor& x, double weight = -1) {
    at::Tensor out;
    self->request(actor, std::chrono::seconds(10), reduce_atom_v,
                  reduce_request{{round, fragment}, {x}, false, weight})
        .receive([&](reduced& r) { out = r.avg.clone(); },
                 [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    return out;
  }
};

}  // namespace

CATCH_TEST_CASE("error feedback keeps one residual per fragment, so streaming's fragments do not reset it",
                "[actors][comm]") {
  int8_feedback f;
  auto reduce = [&](uint64_t round, uint32_t fragment, const at::Tensor& x) {
    return f.reduce(round, fragment, x);
  };
  // One 256-value block with max 1: scale 1/127, and 0.004 = 0.508 steps rounds up to 1/127 (error +0.0039).
  auto x1 = at::full({256}, 0.004f);
  x1[0] = 1.0f;
  auto x2 = at::full({100}, 0.5f);  // fragment 2: another size
  const auto a = reduce(1, 1, x1);
  CATCH_CHECK(std::abs(a[1].item<float>() - 1.0f / 127) < 1e-6);
  reduce(1, 2, x2);
  // Round 2 of fragment 1 carries its residual: 0.004 - 0.0039 = 0.00013 rounds to 0, so over two rounds the
  // sum is 1/127 for 0.008 (error 0.00013), not 2/127 (error 0.0077) as without the residual.
  const auto b = reduce(2, 1, x1);
  CATCH_CHECK(std::abs(b[1].item<float>()) < 1e-6);
  CATCH_CHECK(std::abs((a[1] + b[1]).item<float>() - 0.008f) < 2e-4);
}

CATCH_TEST_CASE("a relay's zeros of relay_weight leave the error-feedback residual as it was",
                "[actors][comm][async]") {
  int8_feedback f;
  auto reduce = [&](uint64_t round, const at::Tensor& x, double weight) {
    return f.reduce(round, 0, x, weight);
  };
  auto x1 = at::full({256}, 0.004f);
  x1[0] = 1.0f;
  const auto a = reduce(1, x1, -1);  // leaves a residual of 0.004 - 1/127 in every value but the first
  // A relay (async, a merge of other nodes): its zeros go out as zeros; the residual is not sent with them.
  CATCH_CHECK(at::equal(reduce(2, at::zeros({256}), comm::relay_weight), at::zeros({256})));
  // The next contribution still carries the residual, as if the relay had not happened.
  const auto b = reduce(3, x1, -1);
  CATCH_CHECK(std::abs(b[1].item<float>()) < 1e-6);
  CATCH_CHECK(std::abs((a[1] + b[1]).item<float>() - 0.008f) < 2e-4);
}
