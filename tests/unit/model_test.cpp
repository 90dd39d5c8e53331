// The Llama-style GPT: parameter counts, deterministic initialisation, attention, bf16, and flat AdamW
// against torch::optim::AdamW.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/adamw.hpp"
#include "models/decoder.hpp"
#include "models/gpt.hpp"
#include "models/model_spec.hpp"
#include "models/torch_compat.hpp"

using namespace longwave::models;

CATCH_TEST_CASE("every preset's layout matches the closed-form parameter count", "[models]") {
  for (const auto& name : preset_names()) {
    for (int64_t vocab : {256, 32000}) {
      auto s = preset_spec(name, vocab, 128);
      int64_t sum = 0;
      for (const auto& [pname, shape] : parameter_layout(s)) {
        int64_t n = 1;
        for (auto d : shape) n *= d;
        sum += n;
      }
      // V*d + L*(2d + 2d^2 + 2*d*kv + 3*d*ffn) + d, written out per preset's numbers.
      const int64_t d = s.dim, kv = s.n_kv_heads * (s.dim / s.n_heads);
      const int64_t expected =
          vocab * d + s.n_layers * (2 * d + 2 * d * d + 2 * d * kv + 3 * d * s.ffn_hidden) + d;
      CATCH_CHECK(sum == expected);
      CATCH_CHECK(closed_form_param_count(s) == expected);
    }
  }
  CATCH_CHECK(closed_form_param_count(preset_spec("tiny", 256, 128)) >= 1'000'000);
  CATCH_CHECK(closed_form_param_count(preset_spec("tiny", 256, 128)) <= 3'000'000);
  const auto small = closed_form_param_count(preset_spec("small", 256, 128));
  CATCH_CHECK((small >= 10'000'000 && small <= 20'000'000));
  // TinyLlama-1.1B's shape: 22 layers of hidden 2048, 4 KV heads; with its 32000 vocab (tied) about 1.03B.
  auto one_b = preset_spec("1b", 32000, 2048);
  CATCH_CHECK(one_b.n_layers == 22);
  CATCH_CHECK(one_b.dim == 2048);
  CATCH_CHECK(closed_form_param_count(one_b) == 1'034'512'384);
  CATCH_CHECK_THROWS(preset_spec("huge", 256, 128));
}

CATCH_TEST_CASE("a preset with shape overrides resolves to that shape and its parameter count", "[models]") {
  longwave::config::model_section m;  // tiny, context 128
  m.dim = 256, m.heads = 4, m.kv_heads = 4;
  const auto s = spec_of(m, 256);
  CATCH_CHECK(
      (s.dim == 256 && s.n_layers == 4 && s.n_heads == 4 && s.n_kv_heads == 4 && s.ffn_hidden == 512));
  // 256*256 + 4*(2*256 + 2*256^2 + 2*256*256 + 3*256*512) + 256
  CATCH_CHECK(closed_form_param_count(s) == 2'689'280);
  CATCH_CHECK(model_label(s) == "tiny dim=256 layers=4 heads=4 kv_heads=4 ffn_hidden=512");
  // Overrides equal to the preset's values are the preset: a checkpoint of either resumes the other.
  m = {};
  m.dim = 192;
  CATCH_CHECK(model_label(spec_of(m, 256)) == "tiny");
  // The model builds and runs with the overridden shape (grouped-query, 3 layers).
  m.dim = 128, m.heads = 4, m.kv_heads = 2, m.layers = 3, m.ffn_hidden = 256, m.seq_len = 16;
  const auto g = spec_of(m, 256);
  gpt model(g, at::kFloat);
  model.load_flat(gpt::init_flat(g, 1));
  CATCH_CHECK(model.flat_params().numel() == closed_form_param_count(g));
  CATCH_CHECK(std::isfinite(model.loss(torch::randint(0, 256, {2, 17}, torch::kLong), false).item<double>()));
}

CATCH_TEST_CASE("initialisation is deterministic from the seed", "[models]") {
  auto s = preset_spec("tiny", 256, 32);
  auto a = gpt::init_flat(s, 7), b = gpt::init_flat(s, 7), c = gpt::init_flat(s, 8);
  CATCH_CHECK(at::equal(a, b));
  CATCH_CHECK_FALSE(at::equal(a, c));
}

CATCH_TEST_CASE("an untrained model predicts close to uniform and gradients land in the flat buffer",
                "[models]") {
  auto s = preset_spec("tiny", 256, 32);
  gpt m(s, at::kFloat);
  m.load_flat(gpt::init_flat(s, 1));
  auto tokens = torch::randint(0, 256, {2, 33}, torch::kLong);
  auto loss = m.loss(tokens, true).item<double>();
  CATCH_CHECK(std::abs(loss - std::log(256.0)) < 0.3);
  CATCH_CHECK(m.flat_grads().abs().sum().item<double>() > 0);
  // The gradient of the embedding view is the head of the flat gradient buffer.
  CATCH_CHECK(at::equal(m.parameters()[0].grad().reshape({-1}), m.flat_grads().narrow(0, 0, 256 * s.dim)));
}

CATCH_TEST_CASE("the fused causal attention matches masked softmax attention", "[models]") {
  auto q = torch::randn({2, 3, 16, 8}), k = torch::randn({2, 3, 16, 8}), v = torch::randn({2, 3, 16, 8});
  auto fused = causal_attention(q, k, v);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0);
  auto mask = torch::ones({16, 16}, torch::kBool).triu(1);
  auto plain = torch::matmul(scores.masked_fill(mask, -INFINITY).softmax(-1), v);
  CATCH_CHECK((fused - plain).abs().max().item<double>() < 1e-5);
}

CATCH_TEST_CASE("the model is causal: changing later tokens leaves earlier logits unchanged", "[models]") {
  auto s = preset_spec("tiny", 256, 32);
  gpt m(s, at::kFloat);
  m.load_flat(gpt::init_flat(s, 5));
  auto a = torch::randint(0, 256, {2, 32}, torch::kLong);
  auto b = a.clone();
  b.narrow(1, 20, 12).copy_((b.narrow(1, 20, 12) + 17) % 256);  // a different token at every position >= 20
  const auto la = m.logits(a), lb = m.logits(b);
  CATCH_REQUIRE(la.sizes() == at::IntArrayRef({2, 32, 256}));
  CATCH_CHECK((la.narrow(1, 0, 20) - lb.narrow(1, 0, 20)).abs().max().item<double>() < 1e-5);
  // ... and the later positions do see the change.
  CATCH_CHECK((la.narrow(1, 20, 12) - lb.narrow(1, 20, 12)).abs().max().item<double>() > 1e-3);
}

CATCH_TEST_CASE("logits over a KV cache, a prompt then one token at a time, equal the whole sequence's",
                "[models]") {
  for (const int64_t kv_heads : {6, 2}) {  // multi-head and grouped-query attention
    auto s = preset_spec("tiny", 256, 24);
    s.n_kv_heads = kv_heads;
    gpt m(s, at::kFloat);
    m.load_flat(gpt::init_flat(s, 9));
    const auto seq = torch::randint(0, 256, {2, 24}, torch::kLong);
    const auto whole = m.logits(seq);
    gpt::kv_cache cache;
    const auto prompt = m.logits(seq.narrow(1, 0, 5), cache);
    CATCH_CHECK(cache.length() == 5);
    CATCH_CHECK((prompt - whole.narrow(1, 0, 5)).abs().max().item<double>() < 1e-5);
    double worst = 0;
    for (int64_t t = 5; t < 24; ++t) {
      const auto one = m.logits(seq.narrow(1, t, 1), cache);
      worst = std::max(worst, (one - whole.narrow(1, t, 1)).abs().max().item<double>());
    }
    CATCH_CHECK(cache.length() == 24);
    CATCH_CHECK(worst < 1e-4);
    // A token at another position gives other logits: the cache's positions count.
    gpt::kv_cache other;
    const auto shifted = m.logits(seq.narrow(1, 23, 1), other);
    CATCH_CHECK((shifted - whole.narrow(1, 23, 1)).abs().max().item<double>() > 1e-3);
  }
}

CATCH_TEST_CASE("the decoder gives the last window's logits and starts again from the last half when full",
                "[models]") {
  auto s = preset_spec("tiny", 256, 8);
  gpt m(s, at::kFloat);
  m.load_flat(gpt::init_flat(s, 3));
  const auto last_of = [&](const std::vector<int64_t>& ids, int64_t keep) {
    const std::vector<int64_t> w(ids.end() - keep, ids.end());
    return m.logits(at::tensor(w, at::kLong).view({1, keep})).select(1, keep - 1)[0];
  };
  decoder dec(m, {5, 17, 200, 9, 31, 64, 2, 90, 11, 250});  // longer than the context: its last 8
  CATCH_CHECK((dec.next_logits() - last_of(dec.tokens(), 8)).abs().max().item<double>() < 1e-5);
  // The cache is full, so the first push starts again from the last 4 tokens; the next 4 fill it.
  for (int64_t t = 0; t < 9; ++t) {
    dec.push((t * 41 + 7) % 256);
    const int64_t window = 4 + t % 5;  // 4, 5, ..., 8, then 4 again
    CATCH_CHECK((dec.next_logits() - last_of(dec.tokens(), window)).abs().max().item<double>() < 1e-4);
  }
  CATCH_CHECK(dec.tokens().size() == 19);
  CATCH_CHECK_THROWS_WITH(decoder(m, {}), Catch::Contains("no tokens"));
}

CATCH_TEST_CASE("bf16 and fp32 models agree on the loss", "[models]") {
  auto s = preset_spec("tiny", 256, 32);
  auto theta = gpt::init_flat(s, 3);
  gpt f(s, at::kFloat), h(s, at::kBFloat16);
  f.load_flat(theta);
  h.load_flat(theta);
  auto tokens = torch::randint(0, 256, {2, 33}, torch::kLong);
  const double lf = f.loss(tokens, true).item<double>(), lh = h.loss(tokens, true).item<double>();
  CATCH_CHECK(std::abs(lf - lh) < 0.05);
  CATCH_CHECK(h.flat_grads().scalar_type() == at::kBFloat16);
  CATCH_CHECK(h.flat_grads().abs().sum().item<double>() > 0);
}

CATCH_TEST_CASE("flat AdamW reproduces torch::optim::AdamW", "[models]") {
  torch::manual_seed(0);
  // Two and a half of AdamW's 2^20-value chunks and a ragged tail: chunking must not change a bit.
  const int64_t n = (int64_t{5} << 19) + 123;
  auto p_ref = torch::randn({n}).requires_grad_(true);
  auto p_flat = p_ref.detach().clone();
  torch::optim::AdamW ref({p_ref},
                          torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  adamw flat(n, adamw_options{0.9, 0.95, 1e-8, 0.1});
  for (int i = 0; i < 5; ++i) {
    auto g = torch::randn({n});
    p_ref.mutable_grad() = g.clone();
    ref.step();
    flat.step(p_flat, g, 1e-2);
  }
  CATCH_CHECK((p_ref.detach() - p_flat).abs().max().item<double>() == 0.0);
  CATCH_CHECK(flat.steps() == 5);
}
