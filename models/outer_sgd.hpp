#pragma once
// The DiLoCo outer optimizer: SGD with (Nesterov) momentum on flat fp32 buffers, as torch.optim.SGD.
#include <ATen/core/Tensor.h>

#include "models/model_spec.hpp"

namespace longwave::models {

/// theta <- theta - lr * (delta + mu * b) with b <- mu * b + delta (nesterov), or theta -= lr * b (classic).
class outer_sgd {
 public:
  outer_sgd(double lr, double momentum, bool nesterov) : lr_(lr), mu_(momentum), nesterov_(nesterov) {}
  /// Applies the averaged pseudo-gradient `delta` to `theta` in place; returns the L2 norm of the change.
  double step(at::Tensor& theta, const at::Tensor& delta);
  /// The same step on a part of theta only (Streaming DiLoCo's fragments): `delta` holds the pseudo-gradient
  /// of the ranges, concatenated. The momentum buffer is theta-sized; its other values do not change. Equal,
  /// bit for bit, to step() when the ranges cover theta.
  double step(at::Tensor& theta, const at::Tensor& delta, const flat_ranges& ranges);
  double lr() const { return lr_; }
  at::Tensor& momentum_buffer() { return b_; }
  void set_momentum_buffer(at::Tensor b) { b_ = std::move(b); }

 private:
  /// The step's tensors are contiguous fp32 on the host (a broken invariant aborts).
  static void check_flat(const at::Tensor& theta, const at::Tensor& delta);
  /// Nesterov: theta[off, off+len) -= lr * (delta[d_off, d_off+len) + mu * b[off, off+len)); returns the
  /// norm of that direction.
  double nesterov_apply(at::Tensor& theta, const at::Tensor& delta, int64_t off, int64_t d_off, int64_t len);
  double lr_, mu_;
  bool nesterov_;
  at::Tensor b_;    // undefined until the first step, as in torch
  at::Tensor dir_;  // Nesterov's direction, one chunk, kept between steps (a fresh tensor per step would
                    // fault its pages in again)
};

}  // namespace longwave::models
