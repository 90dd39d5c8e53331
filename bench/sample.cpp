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

#include "models/decoder.hpp"
#include "models/gpt.hpp"
#include "models/model_spec.hpp"

using namespace longwave;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t greedy(const at::Tensor& logits) {
  return logits.argmax().item<int64_t>();
}

/// Greedy tokens/s of `n` tokens after `prompt` through sample's decoder (one position a token).
double cached_tokens_per_s(models::gpt& m, const std::vector<int64_t>& prompt, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  models::decoder dec(m, prompt);
  for (int64_t i = 0; i < n; ++i) dec.push(greedy(dec.next_logits()));
  return static_cast<double>(n) / seconds_since(t0);
}

/// The same with a whole forward pass over the last seq_len tokens a token (what sample did).
double whole_tokens_per_s(models::gpt& m, std::vector<int64_t> ids, int64_t n) {
  const int64_t ctx = m.spec().seq_len;
  const auto last_logits = [&] {
    const auto from = ids.end() - std::min<int64_t>(ctx, static_cast<int64_t>(ids.size()));
    const std::vector<int64_t> w(from, ids.end());
    const auto logits = m.logits(at::tensor(w, at::kLong).view({1, static_cast<int64_t>(w.size())}));
    return logits.select(1, logits.size(1) - 1)[0];
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) ids.push_back(greedy(last_logits()));
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
  (void)cached_tokens_per_s(m, prompt, 4);  // warm-up: allocator and kernels
  const double whole = whole_tokens_per_s(m, prompt, tokens);
  const double cached = cached_tokens_per_s(m, prompt, tokens);
  std::printf(
      "%s (%ld parameters), context %ld, %ld tokens, %d threads: whole pass %.1f tokens/s, "
      "KV cache %.1f tokens/s, ratio %.2f\n",
      preset.c_str(), m.n_params(), context, tokens, at::get_num_threads(), whole, cached, cached / whole);
  return 0;
}
