// Nesterov SGD step of the outer optimizer (PyTorch's SGD with nesterov=True, dampening 0).
#include "models/outer_sgd.hpp"

#include <ATen/ATen.h>

#include <algorithm>
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
  return std::abs(lr_) * nesterov_apply(theta, delta, 0, 0, theta.numel());
}

double outer_sgd::nesterov_apply(at::Tensor& theta, const at::Tensor& delta, int64_t off, int64_t d_off,
                                 int64_t len) {
  // A chunk at a time: the scratch is one chunk, not one more copy of the model. Elementwise, so the result
  // is the same whatever the chunk size.
  constexpr int64_t chunk = int64_t{1} << 20;
  if (!dir_.defined() || dir_.dtype() != theta.dtype()) dir_ = at::empty({chunk}, theta.options());
  double sq = 0;
  for (int64_t i = 0; i < len; i += chunk) {
    const int64_t m = std::min(chunk, len - i);
    auto dir = dir_.narrow(0, 0, m);
    at::add_out(dir, delta.narrow(0, d_off + i, m), b_.narrow(0, off + i, m), mu_);
    theta.narrow(0, off + i, m).add_(dir, -lr_);
    const double part = dir.norm().item<double>();
    sq += part * part;
  }
  return std::sqrt(sq);
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
      if (nesterov_) {
        part = lr_ * nesterov_apply(theta, delta, off, at - len, len);
      } else {
        t.add_(b, -lr_);
        part = lr_ * b.norm().item<double>();
      }
    }
    sq += part * part;
  }
  return std::sqrt(sq);
}

}  // namespace longwave::models
