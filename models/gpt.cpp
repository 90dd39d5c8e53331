// Llama-style GPT forward pass and loss, written with ATen ops over leaf views of one flat buffer.
// B batch, T time, C channels (dim), H heads, Hkv key/value heads, D head_dim, V vocab.
#include "models/gpt.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "models/torch_compat.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models {

namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto xf = x.to(at::kFloat);
  auto y = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return y.to(x.scalar_type()) * w;
}

// x: [B, H, T, D] at positions pos0 .. pos0 + T - 1; rotates pairs (even, odd) by position-dependent angles.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t pos0) {
  const auto T = x.size(2), D = x.size(3);
  auto xr = x.reshape({x.size(0), x.size(1), T, D / 2, 2});
  auto x0 = xr.select(-1, 0), x1 = xr.select(-1, 1);
  // [T, D/2], in x's dtype (under autocast x is bf16 while the tables are fp32; otherwise a no-op)
  auto c = cos.narrow(0, pos0, T).to(x.scalar_type()), s = sin.narrow(0, pos0, T).to(x.scalar_type());
  auto y0 = x0 * c - x1 * s;
  auto y1 = x0 * s + x1 * c;
  return at::stack({y0, y1}, -1).reshape_as(x);
}

}  // namespace

gpt::gpt(const model_spec& spec, at::ScalarType dtype, const at::Device& device) : spec_(spec) {
  n_ = closed_form_param_count(spec);
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  flat_ = at::zeros({n_}, opts);
  flat_grad_ = at::zeros({n_}, opts);
  init(dtype);
}

gpt::gpt(const model_spec& spec, const at::Tensor& flat) : spec_(spec) {
  n_ = closed_form_param_count(spec);
  LW_ASSERT(flat.numel() == n_ && flat.scalar_type() == at::kFloat && flat.is_contiguous(),
            "a model over a flat buffer needs n_params contiguous fp32 values");
  flat_ = flat;
  init(at::kFloat);
}

void gpt::init(at::ScalarType dtype) {
  const auto& spec = spec_;
  LW_ASSERT(spec.dim % spec.n_heads == 0, "dim must be divisible by n_heads");
  LW_ASSERT(spec.n_heads % spec.n_kv_heads == 0, "n_heads must be divisible by n_kv_heads");
  LW_ASSERT(spec.head_dim() % 2 == 0, "head_dim must be even for RoPE");
  int64_t off = 0;
  for (const auto& [name, shape] : parameter_layout(spec)) {
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    auto p = flat_.narrow(0, off, numel).view(shape).detach();
    if (flat_grad_.defined()) {
      p.requires_grad_(true);
      p.mutable_grad() = flat_grad_.narrow(0, off, numel).view(shape);
    }
    params_.push_back(p);
    off += numel;
  }
  LW_ASSERT(off == n_, "parameter layout does not match the closed-form count");

  const int64_t half = spec.head_dim() / 2;
  auto inv_freq = at::pow(spec.rope_theta,
                          at::arange(0, half, at::kDouble) * (-2.0 / static_cast<double>(spec.head_dim())));
  auto t = at::arange(0, spec.seq_len, at::kDouble);
  auto freqs = at::outer(t, inv_freq);  // [T, D/2]
  rope_cos_ = freqs.cos().to(flat_.device(), dtype);
  rope_sin_ = freqs.sin().to(flat_.device(), dtype);
}

gpt::~gpt() = default;

at::Tensor gpt::init_flat(const model_spec& spec, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto flat = at::empty({closed_form_param_count(spec)}, at::kFloat);
  const double std_dev = 0.02;
  const double proj_std = std_dev / std::sqrt(2.0 * static_cast<double>(spec.n_layers));
  int64_t off = 0;
  for (const auto& [name, shape] : parameter_layout(spec)) {
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    auto v = flat.narrow(0, off, numel);
    if (shape.size() == 1) {
      v.fill_(1.0);  // RMSNorm gains
    } else {
      const bool residual_out = name.size() > 3 && (name.compare(name.size() - 2, 2, "wo") == 0 ||
                                                    name.compare(name.size() - 6, 6, "w_down") == 0);
      v.normal_(0.0, residual_out ? proj_std : std_dev, gen);
    }
    off += numel;
  }
  return flat;
}

void gpt::load_flat(const at::Tensor& flat_fp32) {
  LW_ASSERT(flat_fp32.numel() == n_, "flat buffer size does not match the model");
  no_grad_guard no_grad;
  flat_.copy_(flat_fp32);
}

void gpt::zero_grad() {
  if (flat_grad_.defined()) flat_grad_.zero_();
}

at::Tensor gpt::forward_logits(const at::Tensor& idx, kv_cache* cache) {
  const auto& s = spec_;
  const int64_t B = idx.size(0), T = idx.size(1), H = s.n_heads, Hkv = s.n_kv_heads, D = s.head_dim();
  const int64_t pos0 = cache ? cache->length() : 0;  // the position of idx's first token
  const auto& emb = params_[0];
  auto x = at::embedding(emb, idx);  // [B, T, C]
  size_t p = 1;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const auto &attn_norm = params_[p], &wq = params_[p + 1], &wk = params_[p + 2], &wv = params_[p + 3],
               &wo = params_[p + 4], &mlp_norm = params_[p + 5], &w_gate = params_[p + 6],
               &w_up = params_[p + 7], &w_down = params_[p + 8];
    p += 9;
    auto h = rms_norm(x, attn_norm, s.norm_eps);
    auto q = at::linear(h, wq).view({B, T, H, D}).transpose(1, 2);  // [B, H, T, D]
    auto k = at::linear(h, wk).view({B, T, Hkv, D}).transpose(1, 2);
    auto v = at::linear(h, wv).view({B, T, Hkv, D}).transpose(1, 2);
    q = apply_rope(q, rope_cos_, rope_sin_, pos0);
    k = apply_rope(k, rope_cos_, rope_sin_, pos0);
    if (cache) {  // the cache keeps the Hkv heads; the new positions follow the ones it holds
      const auto layer = static_cast<size_t>(l);
      if (cache->k.size() == layer) {
        cache->k.push_back(k);
        cache->v.push_back(v);
      } else {
        k = cache->k[layer] = at::cat({cache->k[layer], k}, 2);
        v = cache->v[layer] = at::cat({cache->v[layer], v}, 2);
      }
    }
    if (Hkv != H) {  // grouped-query attention: each KV head serves H/Hkv query heads
      k = k.repeat_interleave(H / Hkv, 1);
      v = v.repeat_interleave(H / Hkv, 1);
    }
    auto y = attention(q, k, v, /*causal=*/pos0 == 0);  // one new token after pos0 > 0 sees every key
    y = y.transpose(1, 2).reshape({B, T, s.dim});
    x = x + at::linear(y, wo);
    auto m = rms_norm(x, mlp_norm, s.norm_eps);
    x = x + at::linear(at::silu(at::linear(m, w_gate)) * at::linear(m, w_up), w_down);
  }
  x = rms_norm(x, params_[p], s.norm_eps);
  return at::linear(x, emb);  // tied head: [B, T, V]
}

at::Tensor gpt::logits(const at::Tensor& idx) {
  LW_ASSERT(idx.dim() == 2 && idx.size(1) >= 1 && idx.size(1) <= spec_.seq_len,
            "logits: inputs must be [B, T] with 1 <= T <= seq_len");
  no_grad_guard no_grad;
  return forward_logits(idx);
}

at::Tensor gpt::logits(const at::Tensor& idx, kv_cache& cache) {
  const int64_t t = idx.dim() == 2 ? idx.size(1) : 0, held = cache.length();
  LW_ASSERT(
      t >= 1 && (held == 0 || t == 1) && held + t <= spec_.seq_len,
      "logits with a cache: a prompt of 1 <= T <= seq_len into an empty cache, then one token at a time "
      "up to seq_len positions");
  no_grad_guard no_grad;
  return forward_logits(idx, &cache);
}

at::Tensor gpt::loss(const at::Tensor& tokens, bool grad, double scale) {
  const int64_t T = tokens.size(1) - 1;
  LW_ASSERT(T >= 1 && T <= spec_.seq_len, "token batch length exceeds the model context");
  auto idx = tokens.narrow(1, 0, T);
  auto targets = tokens.narrow(1, 1, T).reshape({-1});
  if (!grad) {
    no_grad_guard no_grad;
    cuda_autocast autocast(autocast_);
    auto logits = forward_logits(idx);
    return at::cross_entropy_loss(logits.reshape({-1, spec_.vocab_size}).to(at::kFloat), targets);
  }
  at::Tensor l;
  {
    cuda_autocast autocast(autocast_);
    auto logits = forward_logits(idx);
    l = at::cross_entropy_loss(logits.reshape({-1, spec_.vocab_size}).to(at::kFloat), targets);
  }
  if (scale == 1.0)
    l.backward();
  else
    (l * scale).backward();
  return l.detach();
}

}  // namespace longwave::models
