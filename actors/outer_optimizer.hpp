#pragma once
// The outer optimizer actor: owns theta_global and the Nesterov momentum buffer (flat fp32).
#include <caf/fwd.hpp>

#include <ATen/core/Tensor.h>

#include "config/train_config.hpp"

namespace longwave::actors {

/// Messages: (theta) -> theta; (outer, round, avg_delta) -> theta; (state) -> [theta, momentum] (clones);
/// (load, theta, momentum) -> ok. The returned theta is read-only for receivers until the next outer step.
caf::actor spawn_outer_optimizer(caf::actor_system& sys, const config::outer_section& cfg, at::Tensor theta0);

}  // namespace longwave::actors
