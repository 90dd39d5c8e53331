// Config -> inner-loop options.
#include "actors/run_context.hpp"

namespace longwave::actors {

models::inner_options make_inner_options(const config::train_config& cfg) {
  models::inner_options o;
  o.batch_size = cfg.train.batch_size;
  o.lr = cfg.train.lr;
  o.warmup_steps = cfg.train.warmup_steps;
  o.total_steps = cfg.train.rounds * cfg.train.inner_steps;
  o.min_lr_ratio = cfg.train.min_lr_ratio;
  o.grad_clip = cfg.train.grad_clip;
  o.adam.beta1 = cfg.train.beta1;
  o.adam.beta2 = cfg.train.beta2;
  o.adam.eps = cfg.train.eps;
  o.adam.weight_decay = cfg.train.weight_decay;
  o.bf16 = cfg.model.dtype == "bf16";
  return o;
}

}  // namespace longwave::actors
