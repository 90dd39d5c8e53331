// Inner-step throughput and loss traces of models::inner_trainer on one device (issue 36).
//   throughput (default): tokens/s and peak GPU memory of the 150m shape with a 32k vocabulary at each
//     --batch, bf16 autocast, gradient clipping 1.0 and the real window sampler; the line names the
//     parameter count, vocabulary, batch and sequence length that .gpu/pytorch_anchor.py must match (G1, G4).
//   --attention math, --adamw ops: the same without SDPA's fused kernels, or with AdamW op by op (ablations:
//     what each kernel buys).
//   --trace N: the loss of each of N steps, one per line, deterministic (G5: CPU against CUDA).
//   --overlap: G3 of issue 38: a model-sized fp32 copy to pinned host memory on the side stream
//     (models::host_stage, as the pseudo-gradient goes out), alone and beside the inner steps, and the step
//     time with such a copy beside every step against without, at the first --batch.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "models/gpt.hpp"
#include "models/gpu_info.hpp"
#include "models/host_stage.hpp"
#include "models/inner_trainer.hpp"
#include "models/model_spec.hpp"
#include "models/torch_compat.hpp"

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

/// Ablations of the throughput runs (G1: which kernel buys what): AdamW op by op instead of the fused kernel.
bool fused_adamw = true;

std::unique_ptr<models::inner_trainer> make_trainer(const models::model_spec& spec, int64_t batch,
                                                    const std::string& device, bool autocast, int64_t steps,
                                                    std::shared_ptr<const std::vector<uint16_t>> tokens) {
  models::inner_options o;
  o.adam.fused = fused_adamw;
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Seconds per step of `steps` steps queued as a worker queues them; with `copy`, one copy staged after each.
double timed_steps(models::inner_trainer& t, const std::string& device, int64_t steps,
                   models::host_stage* copy, const at::Tensor& src, std::vector<double>* copy_s) {
  synchronize(device);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<models::host_stage::staged> last;
  for (int64_t i = 0; i < steps; ++i) {
    (void)t.step_async();
    if (last) {  // the previous copy, read while this step runs
      last->done->synchronize();
      copy_s->push_back(copy->last_copy_seconds());
      last.reset();
    }
    if (copy != nullptr) last = copy->stage(src);
  }
  (void)t.take_pending_loss();
  if (last) {
    last->done->synchronize();
    copy_s->push_back(copy->last_copy_seconds());
  }
  synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(steps);
}

/// G3: the copy's device time beside the steps / alone (<= 1.5), the step time with copies / without
/// (<= 1.03).
int overlap(const models::model_spec& spec, int64_t batch, const std::string& device, bool autocast,
            int64_t warmup, int64_t timed, std::shared_ptr<const std::vector<uint16_t>> tokens) {
  auto t = make_trainer(spec, batch, device, autocast, warmup + 3 * timed, std::move(tokens));
  for (int64_t i = 0; i < warmup; ++i) t->step();
  const at::Device dev(device);
  const auto src = at::randn({models::closed_form_param_count(spec)}, at::dtype(at::kFloat).device(dev));
  models::host_stage stage(dev);
  stage.time_copies();
  std::vector<double> alone, beside;
  for (int i = 0; i < 7; ++i) {  // the device idle
    synchronize(device);
    stage.stage(src).done->synchronize();
    alone.push_back(stage.last_copy_seconds());
  }
  const double plain = timed_steps(*t, device, timed, nullptr, src, nullptr);
  const double with_copy = timed_steps(*t, device, timed, &stage, src, &beside);
  const double plain_again = timed_steps(*t, device, timed, nullptr, src, nullptr);
  const double without = std::min(plain, plain_again);
  const double mb = static_cast<double>(src.numel()) * 4 / 1e6;
  if (median(alone) < 0) {
    std::printf("the copy's device time needs a GPU; step with copy / without = %.4f\n", with_copy / without);
    return 0;
  }
  std::printf(
      "copy of %.0f MB to pinned memory on the side stream: alone %.2f ms (%.1f GB/s), beside the steps "
      "%.2f ms (median of %zu)\n",
      mb, median(alone) * 1e3, mb / 1e3 / median(alone), median(beside) * 1e3, beside.size());
  std::printf("step B=%ld: %.2f ms without copies (%.2f, %.2f), %.2f ms with one copy beside each\n", batch,
              without * 1e3, plain * 1e3, plain_again * 1e3, with_copy * 1e3);
  // The ratios first: gpu-check's table shows a line's first 110 characters.
  std::printf(
      "G3: copy beside / alone = %.3f (goal <= 1.5); step with copy / without = %.4f (goal <= 1.03); on %s\n",
      median(beside) / median(alone), with_copy / without, models::gpu_summary().c_str());
  return 0;
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
  bool overlap_mode = false;
  app.add_flag("--overlap", overlap_mode, "G3: a pseudo-gradient-sized copy beside the steps (issue 38)");
  std::string attention = "sdpa", adamw = "fused";
  app.add_option("--attention", attention, "sdpa (its best kernel: flash on a GPU) or math (an ablation)")
      ->check(CLI::IsMember({"sdpa", "math"}))
      ->capture_default_str();
  app.add_option("--adamw", adamw, "fused (where LibTorch has the kernel) or ops (op by op: an ablation)")
      ->check(CLI::IsMember({"fused", "ops"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fused_adamw = adamw == "fused";
  if (attention == "math" && !models::sdpa_math_only())
    std::printf("note: this LibTorch has only the math attention kernel: --attention math changes nothing\n");

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
  if (overlap_mode)
    return overlap(spec, batches.front(), device, autocast && device != "cpu", warmup, timed, tokens);
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
    const std::string ablation = attention == "math" || !fused_adamw
                                     ? " [attention " + attention + ", adamw " + adamw + "]"
                                     : std::string();
    std::printf(
        "longwave %s (%.1fM params, vocab %ld) B=%ld T=%ld on %s%s: %.1f ms/step, %.0f tok/s, model TFLOP/s "
        "%.0f "
        "(6N, no attention), peak mem %.1f GiB, last loss %.3f\n",
        preset.c_str(), n / 1e6, vocab, b, seq_len, device.c_str(), ablation.c_str(),
        s * 1e3 / static_cast<double>(timed), tps, 6 * n * tps / 1e12,
        static_cast<double>(mem.peak) / (1 << 30), loss);
  }
  return 0;
}
