#pragma once
// What differs between the two LibTorch lines Longwave builds against, Debian's 1.13 (CPU, the default and
// CI's) and a GPU user's 2.x (CUDA), in one place: the rest of the code calls these names only.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <tuple>

namespace longwave::models {

/// No autograd recording in this scope (2.x's ATen headers no longer declare at::NoGradGuard; c10's guard is
/// in both lines).
using no_grad_guard = c10::NoGradGuard;

/// Causal scaled-dot-product attention of [B, H, T, D] q, k, v with ATen's fused op: 1.13 has
/// at::_scaled_dot_product_attention (returns a tuple), 2.x at::scaled_dot_product_attention.
inline at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  return std::get<0>(at::_scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                       /*need_attn_weights=*/false, /*is_causal=*/true));
#endif
}

}  // namespace longwave::models
