// `longwave sample`'s decoding speed: tokens/s of one token a forward pass over a KV cache (what sample does)
// against a whole forward pass over the last seq_len tokens a token (what it did), on one model of a preset,
// initialised from a seed, in one run. Both read a context-long prompt first; the ratio is cached ÷ whole.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "models/gpt.hpp"
#include "models/model_spec.hpp"

using namespace longwave;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Greedy tokens/s of `n` tokens after `prompt`, with or without the cache (sample's loop, without the draw).
double tokens_per_s(models::gpt& m, std::vector<int64_t> ids, int64_t n, bool cached) {
  const int64_t ctx = m.spec().seq_len;
  const auto window = [&](int64_t keep) {
    const auto from = ids.end() - std::min<int64_t>(keep, static_cast<int64_t>(ids.size()));
    const std::vector<int64_t> w(from, ids.end());
    return at::tensor(w, at::kLong).view({1, static_cast<int64_t>(w.size())});
  };
  models::gpt::kv_cache cache;
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor logits = cached ? m.logits(window(ctx), cache) : m.logits(window(ctx));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t next = logits.select(1, logits.size(1) - 1)[0].argmax().item<int64_t>();
    ids.push_back(next);
    if (!cached) {
      logits = m.logits(window(ctx));
    } else if (cache.length() == ctx) {
      cache = {};
      logits = m.logits(window(std::max<int64_t>(1, ctx / 2)), cache);
    } else {
      logits = m.logits(at::tensor({next}, at::kLong).view({1, 1}), cache);
    }
  }
  return static_cast<double>(n) / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decoding tokens/s with the KV cache against a whole forward pass a token, one run"};
  std::string preset = "tiny";
  int64_t context = 128, tokens = 256, threads = 0;
  app.add_option("--preset", preset, "Model preset")->capture_default_str();
  app.add_option("--context", context, "The model's context (seq_len)")->capture_default_str();
  app.add_option("--tokens", tokens, "Tokens written by each way")->capture_default_str();
  app.add_option("--threads", threads, "Intra-op threads (0: LibTorch's default)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));

  const auto spec = models::preset_spec(preset, 256, context);
  models::gpt m(spec, models::gpt::init_flat(spec, 1));
  std::vector<int64_t> prompt(static_cast<size_t>(context));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>((i * 37 + 11) % 256);
  (void)tokens_per_s(m, prompt, 4, true);  // warm-up: allocator and kernels
  const double whole = tokens_per_s(m, prompt, tokens, false);
  const double cached = tokens_per_s(m, prompt, tokens, true);
  std::printf(
      "%s (%ld parameters), context %ld, %ld tokens, %d threads: whole pass %.1f tokens/s, "
      "KV cache %.1f tokens/s, ratio %.2f\n",
      preset.c_str(), m.n_params(), context, tokens, at::get_num_threads(), whole, cached, cached / whole);
  return 0;
}
