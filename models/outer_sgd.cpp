// Nesterov SGD step of the outer optimizer (PyTorch's SGD with nesterov=True, dampening 0).
#include "models/outer_sgd.hpp"

#include <ATen/ATen.h>

namespace longwave::models {

void outer_sgd::step(at::Tensor& theta, const at::Tensor& delta) {
  at::NoGradGuard no_grad;
  if (mu_ == 0.0) {
    theta.add_(delta, -lr_);
    return;
  }
  if (!b_.defined()) {
    b_ = delta.clone();  // torch: first step initialises the buffer with the gradient
  } else {
    b_.mul_(mu_).add_(delta);
  }
  if (nesterov_) {
    theta.add_(delta.add(b_, mu_), -lr_);
  } else {
    theta.add_(b_, -lr_);
  }
}

}  // namespace longwave::models
