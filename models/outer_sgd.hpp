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
  /// Nesterov on [off, off+len) of theta and b (delta from d_off), in one pass: with update_b first
  /// b = mu * b + delta, then theta -= lr * (delta + mu * b); returns the norm of that direction.
  double nesterov_apply(at::Tensor& theta, const at::Tensor& delta, int64_t off, int64_t d_off, int64_t len,
                        bool update_b);
  double lr_, mu_;
  bool nesterov_;
  at::Tensor b_;  // undefined until the first step, as in torch
};

/// Delayed Nesterov (Liu et al. 2024, arXiv 2401.09135), the outer step of asynchronous merges. A merge of k
/// contributions (arrivals) with mean pseudo-gradient g applies its arrivals at once without momentum,
/// theta -= lr * k * g / N, and sums them into a buffer; once N arrivals have come since the last fold, the
/// buffer's mean over them goes into the momentum and is applied:
///   m <- mu * m + buf / a,  theta -= lr * mu * m,  buf <- 0,  a <- 0   (a: arrivals since the last fold).
/// One arrival per merge is the paper's rule; N = 1 is then Nesterov's step, theta -= lr * (g + mu * m) with
/// m <- mu * m + g (docs/02-policies.md, "Asynchronous outer steps").
class delayed_nesterov {
 public:
  delayed_nesterov(double lr, double momentum, int64_t period);
  /// Applies merge number merges() + 1, the mean `g` of `arrivals` contributions, to `theta` in place;
  /// returns the L2 norm of the change. Contiguous fp32 host tensors of one size. 0 arrivals (every
  /// contribution was lost): theta and the buffers stay, and the merge still counts.
  double step(at::Tensor& theta, const at::Tensor& g, int64_t arrivals = 1);
  int64_t period() const { return period_; }
  /// Merges applied so far (theta's version); restored from a checkpoint with the buffers.
  int64_t merges() const { return merges_; }
  void set_merges(int64_t n) { merges_ = n; }
  /// Arrivals summed into the buffer since the last fold (below the period between steps).
  int64_t arrivals() const { return arrivals_; }
  void set_arrivals(int64_t a) { arrivals_ = a; }
  /// The momentum m and the buffer of the period's pseudo-gradients (undefined until the first step; the
  /// buffer stays undefined for N = 1).
  at::Tensor& momentum_buffer() { return m_; }
  at::Tensor& period_buffer() { return buf_; }

 private:
  double lr_, mu_;
  int64_t period_;
  int64_t merges_ = 0;
  int64_t arrivals_ = 0;
  at::Tensor m_, buf_;
};

/// CGAD's age scaling (arXiv 2605.09126) of a pseudo-gradient `staleness` versions old: a cosine gate that
/// reaches 0 at `cutoff` versions, times exp(-alpha * staleness). 1 at staleness 0; 0 from the cutoff on.
double cgad_scale(int64_t staleness, double alpha, int64_t cutoff);

}  // namespace longwave::models
