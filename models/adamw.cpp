// Flat AdamW: mirrors torch/csrc/api/src/optim/adamw.cpp op for op, so a flat run reproduces it exactly.
#include "models/adamw.hpp"

#include <ATen/ATen.h>

#include <cmath>

namespace longwave::models {

adamw::adamw(int64_t n, adamw_options opts)
    : o_(opts), m_(at::zeros({n}, at::kFloat)), v_(at::zeros({n}, at::kFloat)) {}

void adamw::step(at::Tensor& param, const at::Tensor& grad, double lr) {
  at::NoGradGuard no_grad;
  ++t_;
  param.mul_(1 - lr * o_.weight_decay);
  m_.mul_(o_.beta1).add_(grad, 1 - o_.beta1);
  v_.mul_(o_.beta2).addcmul_(grad, grad, 1 - o_.beta2);
  const double bias_correction1 = 1 - std::pow(o_.beta1, static_cast<double>(t_));
  const double bias_correction2 = 1 - std::pow(o_.beta2, static_cast<double>(t_));
  auto denom = (v_.sqrt() / std::sqrt(bias_correction2)).add_(o_.eps);
  param.addcdiv_(m_, denom, -lr / bias_correction1);
}

}  // namespace longwave::models
