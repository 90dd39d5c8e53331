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
  if (!nesterov_) {
    theta.add_(b_, -lr_);
    return std::abs(lr_) * b_.norm().item<double>();
  }
  at::add_out(scratch(theta), delta, b_, mu_);
  theta.add_(dir_, -lr_);
  return std::abs(lr_) * dir_.norm().item<double>();
}

at::Tensor& outer_sgd::scratch(const at::Tensor& like) {
  if (!dir_.defined() || dir_.numel() != like.numel() || dir_.dtype() != like.dtype())
    dir_ = at::empty({like.numel()}, like.options());
  return dir_;
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
      at::Tensor dir = b;
      if (nesterov_) {
        dir = scratch(theta).narrow(0, off, len);
        at::add_out(dir, d, b, mu_);
      }
      t.add_(dir, -lr_);
      part = lr_ * dir.norm().item<double>();
    }
    sq += part * part;
  }
  return std::sqrt(sq);
}

}  // namespace longwave::models
