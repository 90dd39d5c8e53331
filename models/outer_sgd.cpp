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

double outer_sgd::step(at::Tensor& theta, const at::Tensor& delta, const flat_ranges& ranges) {
  at::NoGradGuard no_grad;
  // Starting from a zero buffer, mu * 0 + delta is delta exactly: the same first step as torch's clone.
  if (mu_ != 0.0 && !b_.defined()) b_ = at::zeros_like(theta);
  double sq = 0;
  int64_t at = 0;
  for (const auto& [off, len] : ranges) {
    auto t = theta.narrow(0, off, len);
    auto d = delta.narrow(0, at, len);
    at += len;
    double part = 0;
    if (mu_ == 0.0) {
      t.add_(d, -lr_);
      part = lr_ * d.norm().item<double>();
    } else {
      auto b = b_.narrow(0, off, len);
      b.mul_(mu_).add_(d);
      const at::Tensor dir = nesterov_ ? d.add(b, mu_) : b;
      t.add_(dir, -lr_);
      part = lr_ * dir.norm().item<double>();
    }
    sq += part * part;
  }
  return std::sqrt(sq);
}

}  // namespace longwave::models
