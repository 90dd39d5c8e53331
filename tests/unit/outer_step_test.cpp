// The outer step through the real communicator and outer-optimizer actors, against a hand-computed
// Nesterov sequence.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "actors/communicator.hpp"
#include "actors/outer_optimizer.hpp"
#include "models/outer_sgd.hpp"
#include "runtime/type_ids.hpp"

using namespace longwave;
using namespace longwave::runtime;

CATCH_TEST_CASE("three outer steps of two workers follow the hand-computed Nesterov sequence",
                "[actors][outer]") {
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::longwave>();
  caf::actor_system sys{cfg};
  config::outer_section outer_cfg;  // defaults: lr 0.7, momentum 0.9, nesterov
  auto comm = actors::spawn_communicator(sys);
  auto outer = actors::spawn_outer_optimizer(sys, outer_cfg, torch::tensor({1.0f, -2.0f}));
  caf::scoped_actor self{sys};
  // Pseudo-gradients of worker a and b per round; the second element is the first negated.
  const float da[3] = {0.2f, 0.1f, -0.5f}, db[3] = {0.4f, -0.1f, -0.3f};
  // By hand: mean delta 0.3, 0.0, -0.4.
  //   b1 = 0.3            theta1 = 1 - 0.7*(0.3 + 0.27)       = 0.601
  //   b2 = 0.27           theta2 = 0.601 - 0.7*(0 + 0.243)    = 0.4309
  //   b3 = 0.243 - 0.4    theta3 = 0.4309 - 0.7*(-0.4 - 0.1413) = 0.80981
  const double expected[3] = {0.601, 0.4309, 0.80981};
  for (int r = 0; r < 3; ++r) {
    std::vector<at::Tensor> parts{torch::tensor({da[r], -da[r]}), torch::tensor({db[r], -db[r]})};
    at::Tensor avg;
    self->request(comm, std::chrono::seconds(10), reduce_atom_v, uint64_t(r + 1), parts)
        .receive([&](at::Tensor& t) { avg = t; }, [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    at::Tensor theta;
    self->request(outer, std::chrono::seconds(10), outer_atom_v, uint64_t(r + 1), avg)
        .receive([&](at::Tensor& t) { theta = t.clone(); },
                 [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
    CATCH_CHECK(std::abs(theta[0].item<double>() - expected[r]) < 1e-6);
    CATCH_CHECK(std::abs(theta[1].item<double>() - (-2.0 - (expected[r] - 1.0))) < 1e-6);
  }
  // A stale round is refused, and theta is unchanged.
  self->request(outer, std::chrono::seconds(10), outer_atom_v, uint64_t(2), torch::tensor({1.0f, 1.0f}))
      .receive([&](at::Tensor&) { CATCH_FAIL("stale round accepted"); },
               [&](caf::error& e) { CATCH_CHECK(e.code() == static_cast<uint8_t>(errc::stale_round)); });
  // Contributions of different sizes are refused by the communicator.
  self->request(comm, std::chrono::seconds(10), reduce_atom_v, uint64_t(4),
                std::vector<at::Tensor>{torch::ones({2}), torch::ones({3})})
      .receive([&](at::Tensor&) { CATCH_FAIL("mismatched sizes accepted"); },
               [&](caf::error& e) { CATCH_CHECK(e.code() == static_cast<uint8_t>(errc::malformed_frame)); });
  self->send_exit(comm, caf::exit_reason::user_shutdown);
  self->send_exit(outer, caf::exit_reason::user_shutdown);
}

CATCH_TEST_CASE("outer SGD with momentum 0 and lr 1 lands exactly on theta minus delta", "[models][outer]") {
  models::outer_sgd sgd(1.0, 0.0, true);
  auto theta = torch::tensor({3.0f, 4.0f});
  sgd.step(theta, torch::tensor({1.0f, -1.0f}));
  CATCH_CHECK(theta[0].item<float>() == 2.0f);
  CATCH_CHECK(theta[1].item<float>() == 5.0f);
}
