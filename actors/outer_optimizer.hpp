#pragma once
// The outer optimizer actor: owns theta_global and the Nesterov momentum buffer (flat fp32), and under
// diloco.outer = "eager" each local replica's own outer parameters, momentum and last pseudo-gradient.
#include <caf/actor.hpp>

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "config/train_config.hpp"
#include "models/model_spec.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// What the outer step works on besides the plain policy (docs/02-policies.md).
struct outer_policy {
  std::vector<models::flat_ranges> fragments;  ///< streaming: the P fragments' ranges of theta
  int64_t eager_replicas = 0;                  ///< eager: local workers, each with its own outer state
  int64_t global_workers = 1;                  ///< eager: M, the workers of the whole run
  /// eager in a cluster: the workers the last average was over (the live members' workers; 0: unknown);
  /// M follows it as nodes come and go.
  std::function<double()> live_workers;
  /// diloco.outer = "async": Delayed Nesterov's period N (models::delayed_nesterov); every whole-theta step
  /// is then one merge, and its label's round the version it makes. 0: the plain outer step.
  int64_t dn_period = 0;
  /// A node with a worker on a GPU: theta (and eager's per-replica theta) lives in pinned host memory, so
  /// that the workers' uploads of it are fast DMA copies (models::inner_trainer). The momentum never crosses
  /// to a device and stays in pageable memory.
  bool pinned_theta = false;
};

/// Messages: runtime::outer_actor. The returned tensors are read-only for receivers until the next outer
/// step. With a metrics sink, each outer step reports the pseudo-gradient and update norms and the outer
/// learning rate (gauges, and an "outer" line of metrics.jsonl).
runtime::outer_actor spawn_outer_optimizer(caf::actor_system& sys, const config::outer_section& cfg,
                                           at::Tensor theta0, runtime::metrics_actor metrics = {},
                                           outer_policy policy = {});

}  // namespace longwave::actors
