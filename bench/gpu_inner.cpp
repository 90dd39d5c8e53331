// Inner-step throughput and loss traces of models::inner_trainer on one device (issue 36).
//   throughput (default): tokens/s and peak GPU memory of the 150m shape with a 32k vocabulary at each
//     --batch, bf16 autocast, gradient clipping 1.0 and the real window sampler; the line names the
//     parameter count, vocabulary, batch and sequence length that .gpu/pytorch_anchor.py must match (G1, G4).
//   --trace N: the loss of each of N steps, one per line, deterministic (G5: CPU against CUDA).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>

#include "models/gpt.hpp"
#include "models/gpu_info.hpp"
#include "models/inner_trainer.hpp"
#include "models/model_spec.hpp"

using namespace longwave;

namespace {

/// Tokens with structure a model can learn (a noisy order-2 recurrence), reproducible from the seed.
std::shared_ptr<const std::vector<uint16_t>> synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> t(static_cast<size_t>(n));
  t[0] = 1, t[1] = 2;
  for (size_t i = 2; i < t.size(); ++i)
    t[i] = static_cast<uint16_t>(rng() % 8 == 0 ? rng() % vocab : (t[i - 1] * 31 + t[i - 2] * 7 + 3) % vocab);
  return std::make_shared<const std::vector<uint16_t>>(std::move(t));
}

std::unique_ptr<models::inner_trainer> make_trainer(const models::model_spec& spec, int64_t batch,
                                                    const std::string& device, bool autocast, int64_t steps,
                                                    std::shared_ptr<const std::vector<uint16_t>> tokens) {
  models::inner_options o;
  o.batch_size = batch;
  o.lr = 4e-4;
  o.warmup_steps = 10;
  o.total_steps = steps;
  o.grad_clip = 1.0;
  o.device = device;
  o.autocast = autocast;
  const int64_t n = static_cast<int64_t>(tokens->size());
  auto t = std::make_unique<models::inner_trainer>(spec, o, std::move(tokens),
                                                   std::vector<models::data::token_span>{{0, n}}, 0, 1234);
  t->set_params(models::gpt::init_flat(spec, 1234));
  return t;
}

void synchronize(const std::string& device) {
  if (device != "cpu") (void)at::zeros({1}, at::Device(device)).item<float>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inner-step tokens/s and peak memory of Longwave's trainer on one device, or a loss trace"};
  std::string device = "cuda:0", preset = "150m";
  int64_t vocab = 32000, seq_len = 1024, warmup = 5, timed = 20, trace = 0;
  std::vector<int64_t> batches{16, 32};
  bool autocast = true;
  app.add_option("--device", device, "cpu or cuda:N")->capture_default_str();
  app.add_option("--preset", preset, "model shape")->capture_default_str();
  app.add_option("--vocab", vocab, "vocabulary")->capture_default_str();
  app.add_option("--seq-len", seq_len, "sequence length")->capture_default_str();
  app.add_option("--batch", batches, "batch sizes to time")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--steps", timed, "timed steps")->capture_default_str();
  app.add_option("--autocast", autocast, "bf16 autocast (CUDA)")->capture_default_str();
  app.add_option("--trace", trace, "print the loss of this many deterministic fp32 steps instead");
  CLI11_PARSE(app, argc, argv);

  auto spec = models::preset_spec(preset, vocab, seq_len);
  auto tokens = synthetic_tokens(int64_t{1} << 22, vocab, 7);
  if (trace > 0) {
    // G5: fp32, deterministic kernels, no TF32, the same data and initialisation on every device.
    at::globalContext().setDeterministicAlgorithms(true, false);
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
    auto t = make_trainer(spec, batches.front(), device, false, trace, tokens);
    for (int64_t i = 0; i < trace; ++i) std::printf("%.9g\n", t->step());
    return 0;
  }
  const int dev = device == "cpu" ? -1 : at::Device(device).index() < 0 ? 0 : at::Device(device).index();
  std::printf("gpu: %s\n", models::gpu_summary().c_str());
  for (const int64_t b : batches) {
    auto t = make_trainer(spec, b, device, autocast && device != "cpu", warmup + timed, tokens);
    for (int64_t i = 0; i < warmup; ++i) t->step();
    synchronize(device);
    if (dev >= 0) models::reset_gpu_peak(dev);
    const auto t0 = std::chrono::steady_clock::now();
    float loss = 0;
    // As a worker steps: each step's loss read during the next one.
    for (int64_t i = 0; i < timed; ++i) (void)t->step_async();
    loss = *t->take_pending_loss();
    synchronize(device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(b * seq_len * timed) / s;
    const auto mem = dev >= 0 ? models::memory_of_gpu(dev) : models::gpu_memory{};
    const double n = static_cast<double>(models::closed_form_param_count(spec));
    std::printf(
        "longwave %s (%.1fM params, vocab %ld) B=%ld T=%ld on %s: %.1f ms/step, %.0f tok/s, model TFLOP/s "
        "%.0f "
        "(6N, no attention), peak mem %.1f GiB, last loss %.3f\n",
        preset.c_str(), n / 1e6, vocab, b, seq_len, device.c_str(), s * 1e3 / static_cast<double>(timed), tps,
        6 * n * tps / 1e12, static_cast<double>(mem.peak) / (1 << 30), loss);
  }
  return 0;
}
