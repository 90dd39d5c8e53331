// Inner step: batch -> loss/backward -> clip -> AdamW on the fp32 master -> copy into the model dtype.
#include "models/inner_trainer.hpp"

#include <ATen/ATen.h>

#include "models/data/window_sampler.hpp"
#include "models/lr_schedule.hpp"
#include "models/torch_compat.hpp"

namespace longwave::models {

inner_trainer::inner_trainer(const model_spec& spec, const inner_options& opts,
                             std::shared_ptr<const std::vector<uint16_t>> train_tokens,
                             std::vector<data::token_span> spans, int64_t worker, uint64_t seed)
    : spec_(spec),
      opts_(opts),
      model_(spec, opts.bf16 ? at::kBFloat16 : at::kFloat),
      adam_(model_.n_params(), opts.adam),
      // fp32: the master is the model's own flat buffer; bf16: a separate fp32 copy.
      master_(opts.bf16 ? at::zeros({model_.n_params()}, at::kFloat) : model_.flat_params()),
      sampler_(std::make_unique<data::window_sampler>(std::move(train_tokens), std::move(spans), worker,
                                                      opts.batch_size, spec.seq_len, seed)) {
  batch_buf_.resize(static_cast<size_t>(opts.batch_size * (spec.seq_len + 1)));
  grad_fp32_ = opts.bf16 ? at::zeros({model_.n_params()}, at::kFloat) : model_.flat_grads();
}

inner_trainer::~inner_trainer() = default;

void inner_trainer::set_params(const at::Tensor& theta) {
  master_.copy_(theta);
  if (opts_.bf16) model_.load_flat(master_);
}

void inner_trainer::mix(const at::Tensor& theta, const flat_ranges& ranges, double alpha) {
  no_grad_guard no_grad;
  for (const auto& [off, len] : ranges) {
    auto local = master_.narrow(0, off, len);
    auto global = theta.narrow(0, off, len);
    if (alpha == 0.0)
      local.copy_(global);  // exactly theta, as set_params
    else
      local.mul_(alpha).add_(global, 1.0 - alpha);
  }
  if (opts_.bf16) model_.load_flat(master_);
}

double inner_trainer::current_lr() const {
  return warmup_cosine_lr(opts_.lr, adam_.steps(), opts_.warmup_steps, opts_.total_steps, opts_.min_lr_ratio);
}

int64_t inner_trainer::tokens_per_step() const {
  return opts_.batch_size * spec_.seq_len;
}

void inner_trainer::next_batch() {
  sampler_->next(batch_buf_);
  batch_ = at::from_blob(batch_buf_.data(), {opts_.batch_size, spec_.seq_len + 1}, at::kLong);
}

float inner_trainer::compute_grad() {
  next_batch();
  model_.zero_grad();
  auto l = model_.loss(batch_, /*grad=*/true);
  if (opts_.bf16) grad_fp32_.copy_(model_.flat_grads());
  return l.item<float>();
}

void inner_trainer::apply_update(at::Tensor& g) {
  no_grad_guard no_grad;
  if (opts_.grad_clip > 0) {
    const double norm = g.norm().item<double>();
    const double coef = opts_.grad_clip / (norm + 1e-6);
    if (coef < 1.0) g.mul_(coef);
  }
  adam_.step(master_, g, current_lr());
  if (opts_.bf16) model_.load_flat(master_);
}

float inner_trainer::step() {
  const float l = compute_grad();
  apply_update(grad_fp32_);
  return l;
}

void inner_trainer::apply_grad(const at::Tensor& grad_fp32) {
  grad_fp32_.copy_(grad_fp32);
  apply_update(grad_fp32_);
}

double inner_trainer::evaluate(const at::Tensor& theta, const std::vector<uint16_t>& val_tokens,
                               int64_t n_batches) {
  // fp32: a model over theta itself (no copy; theta does not change while we evaluate), the replica
  // untouched.
  if (!opts_.bf16) {
    gpt over_theta(spec_, theta.to(at::kFloat).contiguous());
    return validation_loss(over_theta, val_tokens, opts_.batch_size, n_batches);
  }
  model_.load_flat(theta);
  const double loss = validation_loss(model_, val_tokens, opts_.batch_size, n_batches);
  model_.load_flat(master_);
  return loss;
}

double validation_loss(gpt& model, const std::vector<uint16_t>& val_tokens, int64_t batch_size,
                       int64_t n_batches) {
  no_grad_guard no_grad;
  const int64_t seq_len = model.spec().seq_len;
  double sum = 0;
  for (int64_t b = 0; b < n_batches; ++b) {
    auto buf = data::validation_batch(val_tokens, b, batch_size, seq_len);
    auto t = at::from_blob(buf.data(), {batch_size, seq_len + 1}, at::kLong);
    sum += model.loss(t, /*grad=*/false).item<double>();
  }
  return sum / static_cast<double>(n_batches);
}

inner_state inner_trainer::state(bool lend) const {
  inner_state s;
  s.master = lend ? master_ : master_.clone();
  s.exp_avg = lend ? adam_.exp_avg() : adam_.exp_avg().clone();
  s.exp_avg_sq = lend ? adam_.exp_avg_sq() : adam_.exp_avg_sq().clone();
  s.adam_steps = adam_.steps();
  s.sampler_position = sampler_->position();
  return s;
}

void inner_trainer::load_state(const inner_state& s) {
  set_params(s.master);
  adam_.exp_avg().copy_(s.exp_avg);
  adam_.exp_avg_sq().copy_(s.exp_avg_sq);
  adam_.set_steps(s.adam_steps);
  sampler_->seek(s.sampler_position);
}

}  // namespace longwave::models
