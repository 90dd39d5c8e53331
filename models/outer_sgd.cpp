// Nesterov SGD step of the outer optimizer (PyTorch's SGD with nesterov=True, dampening 0).
#include "models/outer_sgd.hpp"

#include <ATen/ATen.h>

#include <cmath>

namespace longwave::models {

double outer_sgd::step(at::Tensor& theta, const at::Tensor& delta) {
  at::NoGradGuard no_grad;
  if (mu_ == 0.0) {
    theta.add_(delta, -lr_);
    return std::abs(lr_) * delta.norm().item<double>();
  }
  if (!b_.defined()) {
    b_ = delta.clone();  // torch: first step initialises the buffer with the gradient
  } else {
    b_.mul_(mu_).add_(delta);
  }
  const at::Tensor dir = nesterov_ ? delta.add(b_, mu_) : b_;
  theta.add_(dir, -lr_);
  return std::abs(lr_) * dir.norm().item<double>();
}

}  // namespace longwave::models
