// Evaluator actor: a detached thread, one torch thread, on the device of the node's first worker (a GPU node
// evaluates on its GPU, with the workers' autocast). fp32: each evaluation runs a model over the theta it is
// handed (the coordinator's clone, or theta itself when the training waits; a copy on a GPU), so it keeps no
// model-sized buffer between evaluations; bf16: its own bf16 model, into which theta is copied.
#include "actors/evaluator.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "models/gpt.hpp"
#include "models/inner_trainer.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

double evaluate_fp32(const run_context& ctx, const at::Tensor& theta, at::Device device, bool autocast,
                     int64_t n_batches) {
  models::gpt over_theta(ctx.spec, theta.to(device, at::kFloat).contiguous());
  over_theta.set_autocast(autocast);
  return models::validation_loss(over_theta, *ctx.val_tokens, ctx.cfg.train.batch_size, n_batches);
}

struct evaluator_state {
  std::unique_ptr<models::gpt> model;  // bf16 only
  at::Device device = at::kCPU;
  bool autocast = false;
};

evaluator_actor::behavior_type evaluator_fun(evaluator_actor::stateful_pointer<evaluator_state> self,
                                             std::shared_ptr<const run_context> ctx) {
  at::set_num_threads(1);
  const auto opts = ctx->inner_of(0);
  self->state.device = at::Device(opts.device);
  self->state.autocast = opts.autocast;
  if (ctx->cfg.model.dtype == config::model_dtype::bf16) {
    self->state.model = std::make_unique<models::gpt>(ctx->spec, at::kBFloat16, self->state.device);
    self->state.model->set_autocast(opts.autocast);
  }
  return {
      [=](eval_atom, at::Tensor theta, int64_t n_batches) -> caf::result<double> {
        try {
          const auto batch = ctx->cfg.train.batch_size;
          if (auto& model = self->state.model) {
            model->load_flat(theta);
            return models::validation_loss(*model, *ctx->val_tokens, batch, n_batches);
          }
          return evaluate_fp32(*ctx, theta, self->state.device, self->state.autocast, n_batches);
        } catch (const c10::Error& e) {
          return make_error(errc::torch_error, std::string("evaluation: ") + e.what_without_backtrace());
        } catch (const std::exception& e) {
          return make_error(errc::torch_error, std::string("evaluation: ") + describe(e));
        }
      },
  };
}

}  // namespace

double evaluate_theta(const run_context& ctx, const at::Tensor& theta, int64_t n_batches) {
  const auto opts = ctx.inner_of(0);
  const at::Device device(opts.device);
  if (ctx.cfg.model.dtype != config::model_dtype::bf16)
    return evaluate_fp32(ctx, theta, device, opts.autocast, n_batches);
  models::gpt model(ctx.spec, at::kBFloat16, device);
  model.set_autocast(opts.autocast);
  model.load_flat(theta);
  return models::validation_loss(model, *ctx.val_tokens, ctx.cfg.train.batch_size, n_batches);
}

evaluator_actor spawn_evaluator(caf::actor_system& sys, std::shared_ptr<const run_context> ctx) {
  return sys.spawn<caf::detached>(evaluator_fun, std::move(ctx));
}

}  // namespace longwave::actors
