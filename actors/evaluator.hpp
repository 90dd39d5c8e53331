#pragma once
// The evaluator actor: validation loss of theta on its own model copy and thread, so that evaluation runs off
// the training path ([eval] async).
#include <caf/actor.hpp>

#include <memory>

#include "actors/run_context.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// Message: (eval, theta, n_batches) -> mean validation loss. theta must not change until the answer (send a
/// clone). Requests are answered in order. Costs one model copy of memory.
runtime::evaluator_actor spawn_evaluator(caf::actor_system& sys, std::shared_ptr<const run_context> ctx);

/// One evaluation of theta as a run's evaluator or worker 0 makes it: on worker 0's device with its autocast,
/// a bf16 model for a bf16 run, on the calling thread. Throws what LibTorch throws.
double evaluate_theta(const run_context& ctx, const at::Tensor& theta, int64_t n_batches);

}  // namespace longwave::actors
