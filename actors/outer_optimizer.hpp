#pragma once
// The outer optimizer actor: owns theta_global and the Nesterov momentum buffer (flat fp32), and under
// diloco.outer = "eager" each local replica's own outer parameters, momentum and last pseudo-gradient.
#include <caf/actor.hpp>

#include <ATen/core/Tensor.h>

#include <vector>

#include "config/train_config.hpp"
#include "models/model_spec.hpp"

namespace longwave::actors {

/// What the outer step works on besides the plain policy (ARCHITECTURE.md, "Outer-step policies").
struct outer_policy {
  std::vector<models::flat_ranges> fragments;  ///< streaming: the P fragments' ranges of theta
  int64_t eager_replicas = 0;                  ///< eager: local workers, each with its own outer state
  int64_t global_workers = 1;                  ///< eager: M, the workers of the whole run
};

/// Messages:
///   (theta) -> theta
///   (theta, n) -> n tensors: each local replica's outer parameters (eager), or theta n times
///   (theta, new_theta) -> ok: replaces theta only (eager: the cluster's mean at the end)
///   (outer, round, avg_delta) -> theta: sync / delayed
///   (outer, round, seq, fragment_delta) -> theta: streaming, fragment seq % P; (round, seq) increase
///   (eager, round, avg_prev, deltas) -> [theta, theta_0, ...]: eager, every replica's proxy step; theta is
///     their mean (avg_prev undefined: no earlier average)
///   (state) -> [theta, momentum] (+ eager: outer_theta, outer_momentum, prev_delta per replica), clones
///   (load, theta, momentum) -> ok; (load, per-replica triples) -> ok (eager)
/// The returned tensors are read-only for receivers until the next outer step. With a metrics sink, each
/// outer step reports the pseudo-gradient and update norms and the outer learning rate (gauges, and an
/// "outer" line of metrics.jsonl).
caf::actor spawn_outer_optimizer(caf::actor_system& sys, const config::outer_section& cfg, at::Tensor theta0,
                                 caf::actor metrics = {}, outer_policy policy = {});

}  // namespace longwave::actors
