#pragma once
// The outer optimizer actor: owns theta_global and the Nesterov momentum buffer (flat fp32).
#include <caf/actor.hpp>

#include <ATen/core/Tensor.h>

#include "config/train_config.hpp"

namespace longwave::actors {

/// Messages: (theta) -> theta; (outer, round, avg_delta) -> theta; (state) -> [theta, momentum] (clones);
/// (load, theta, momentum) -> ok. The returned theta is read-only for receivers until the next outer step.
/// With a metrics sink, each outer step reports the pseudo-gradient and update norms and the outer learning
/// rate (gauges, and an "outer" line of metrics.jsonl).
caf::actor spawn_outer_optimizer(caf::actor_system& sys, const config::outer_section& cfg, at::Tensor theta0,
                                 caf::actor metrics = {});

}  // namespace longwave::actors
