// Outer optimizer actor: theta <- theta - lr * (delta + mu * b), b <- mu * b + delta.
#include "actors/outer_optimizer.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "models/outer_sgd.hpp"
#include "runtime/caf_errors.hpp"
#include "runtime/json_line.hpp"
#include "runtime/type_ids.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct outer_state {
  at::Tensor theta;
  std::unique_ptr<models::outer_sgd> opt;
  uint64_t last_round = 0;
  bool stepped = false;
};

void report(caf::event_based_actor* self, const caf::actor& metrics, uint64_t round, double lr,
            double delta_norm, double update_norm) {
  if (!metrics) return;
  auto gauge = [&](const char* name, double v) {
    self->send(metrics, gauge_atom_v, std::string(name), std::string(), v);
  };
  gauge("longwave_outer_learning_rate", lr);
  gauge("longwave_outer_pseudo_gradient_norm", delta_norm);
  gauge("longwave_outer_update_norm", update_norm);
  self->send(metrics, record_atom_v,
             json_line("outer")
                 .add("round", round)
                 .add("pseudo_gradient_norm", delta_norm)
                 .add("update_norm", update_norm)
                 .add("outer_lr", lr)
                 .str());
}

caf::behavior outer_fun(caf::stateful_actor<outer_state>* self, config::outer_section cfg, at::Tensor theta0,
                        caf::actor metrics) {
  self->state.theta = std::move(theta0);
  self->state.opt = std::make_unique<models::outer_sgd>(cfg.lr, cfg.momentum, cfg.nesterov);
  return {
      [=](theta_atom) { return self->state.theta; },
      [=](outer_atom, uint64_t round, at::Tensor delta) -> caf::result<at::Tensor> {
        auto& s = self->state;
        if (s.stepped && round <= s.last_round)
          return make_error(errc::stale_round, "outer step for round " + std::to_string(round) +
                                                   " after round " + std::to_string(s.last_round));
        if (delta.numel() != s.theta.numel())
          return make_error(errc::malformed_frame, "pseudo-gradient has " + std::to_string(delta.numel()) +
                                                       " values, theta has " +
                                                       std::to_string(s.theta.numel()));
        try {
          const double delta_norm = delta.norm().item<double>();
          const double update_norm = s.opt->step(s.theta, delta);
          report(self, metrics, round, s.opt->lr(), delta_norm, update_norm);
        } catch (const c10::Error& e) {
          return make_error(errc::torch_error, std::string("outer step: ") + e.what_without_backtrace());
        }
        s.last_round = round;
        s.stepped = true;
        return s.theta;
      },
      [=](state_atom) {
        auto& s = self->state;
        auto& b = s.opt->momentum_buffer();
        return std::vector<at::Tensor>{s.theta.clone(), b.defined() ? b.clone() : at::Tensor()};
      },
      [=](load_atom, at::Tensor theta, at::Tensor momentum) {
        auto& s = self->state;
        s.theta.copy_(theta);
        s.opt->set_momentum_buffer(momentum.defined() ? momentum.clone() : at::Tensor());
        s.stepped = false;
        return true;
      },
  };
}

}  // namespace

caf::actor spawn_outer_optimizer(caf::actor_system& sys, const config::outer_section& cfg, at::Tensor theta0,
                                 caf::actor metrics) {
  return sys.spawn(outer_fun, cfg, std::move(theta0), std::move(metrics));
}

}  // namespace longwave::actors
