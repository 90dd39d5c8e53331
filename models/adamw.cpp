// Flat AdamW: mirrors torch/csrc/api/src/optim/adamw.cpp op for op, so a flat run reproduces it exactly.
#include "models/adamw.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "models/torch_compat.hpp"

namespace longwave::models {

adamw::adamw(int64_t n, adamw_options opts, const at::Device& device)
    : o_(opts),
      m_(at::zeros({n}, at::dtype(at::kFloat).device(device))),
      v_(at::zeros({n}, at::dtype(at::kFloat).device(device))) {}

void adamw::step(at::Tensor& param, const at::Tensor& grad, double lr) {
  no_grad_guard no_grad;
  ++t_;
  if (o_.fused && has_fused_adamw(param)) {
    if (!step_.defined()) step_ = at::empty({1}, at::dtype(at::kFloat).device(param.device()));
    step_.fill_(static_cast<double>(t_));  // a host-to-device write of one value, no synchronisation
    fused_adamw(param, grad, m_, v_, step_, lr, o_.beta1, o_.beta2, o_.weight_decay, o_.eps);
    return;
  }
  param.mul_(1 - lr * o_.weight_decay);
  m_.mul_(o_.beta1).add_(grad, 1 - o_.beta1);
  v_.mul_(o_.beta2).addcmul_(grad, grad, 1 - o_.beta2);
  const double bias_correction1 = 1 - std::pow(o_.beta1, static_cast<double>(t_));
  const double bias_correction2 = 1 - std::pow(o_.beta2, static_cast<double>(t_));
  // The denominator a chunk at a time: the same elementwise ops as torch's (v.sqrt() / c).add_(eps), with
  // a scratch of one chunk instead of two model-sized temporaries.
  constexpr int64_t chunk = int64_t{1} << 20;
  if (!denom_.defined()) denom_ = at::empty({chunk}, param.options());
  const int64_t n = param.numel();
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    auto denom = denom_.narrow(0, 0, len);
    at::sqrt_out(denom, v_.narrow(0, off, len));
    denom.div_(std::sqrt(bias_correction2)).add_(o_.eps);
    param.narrow(0, off, len).addcdiv_(m_.narrow(0, off, len), denom, -lr / bias_correction1);
  }
}

}  // namespace longwave::models
