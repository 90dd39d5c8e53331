// Runtime overhead benchmark: the same model, batch and data in a plain LibTorch loop (torch::optim::AdamW)
// and inside the actor runtime (single mode, one worker), alternated in one run. Prints runtime tokens/s
// divided by plain tokens/s. Goal: >= 0.98.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <ATen/Parallel.h>
#include <torch/nn/utils/clip_grad.h>  // needs torch/types.h first: not self-contained
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "actors/training.hpp"
#include "bench/process_usage.hpp"
#include "config/config_loader.hpp"
#include "models/data/corpus.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/data/shard.hpp"
#include "models/data/window_sampler.hpp"
#include "models/gpt.hpp"
#include "models/lr_schedule.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/log/log.hpp"

using namespace longwave;
namespace fs = std::filesystem;

namespace {

double cpu_seconds() {
  return bench::process_usage::now().cpu_seconds;
}

double plain_loop(const config::train_config& cfg, const std::string& train_path) {
  auto tokens = std::make_shared<const std::vector<uint16_t>>(models::data::read_shard(train_path));
  auto spec = models::preset_spec(cfg.model.preset, 256, cfg.model.seq_len);
  models::gpt model(spec, at::kFloat);
  model.load_flat(models::gpt::init_flat(spec, cfg.run.seed));
  torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(cfg.train.lr)
                                                  .betas({cfg.train.beta1, cfg.train.beta2})
                                                  .weight_decay(cfg.train.weight_decay));
  models::data::window_sampler sampler(tokens, 0, 1, cfg.train.batch_size, cfg.model.seq_len, cfg.run.seed);
  std::vector<int64_t> buf(static_cast<size_t>(cfg.train.batch_size * (cfg.model.seq_len + 1)));
  const int64_t steps = cfg.train.rounds * cfg.train.inner_steps;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const double lr =
        models::warmup_cosine_lr(cfg.train.lr, i, cfg.train.warmup_steps, steps, cfg.train.min_lr_ratio);
    static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options()).lr(lr);
    sampler.next(buf);
    auto batch = torch::from_blob(buf.data(), {cfg.train.batch_size, cfg.model.seq_len + 1}, torch::kLong);
    model.zero_grad();
    auto loss = model.loss(batch, true);
    torch::nn::utils::clip_grad_norm_(model.parameters(), cfg.train.grad_clip);
    opt.step();
    (void)loss.item<float>();
  }
  const double s = runtime::seconds_since(t0);
  return static_cast<double>(steps * cfg.train.batch_size * cfg.model.seq_len) / s;
}

double runtime_run(const config::train_config& cfg) {
  actors::run_options opts;
  opts.fresh = true;
  opts.handle_signals = false;
  if (actors::run_training(cfg, opts) != 0) throw std::runtime_error("runtime run failed");
  std::ifstream in(cfg.run.out_dir + "/result.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const auto text = ss.str();
  auto field = [&](const std::string& k) {
    return std::stod(text.substr(text.find("\"" + k + "\":") + k.size() + 3));
  };
  return field("tokens") / field("train_seconds");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runtime tokens/s divided by a plain LibTorch loop's tokens/s, same model, batch and data"};
  std::string preset = "tiny";
  int64_t steps = 100, batch = 8, seq_len = 128, threads = 2, repeats = 3;
  app.add_option("--preset", preset)->capture_default_str();
  app.add_option("--steps", steps, "Inner steps per measurement")->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--seq-len", seq_len)->capture_default_str();
  app.add_option("--threads", threads, "Torch threads (both loops)")->capture_default_str();
  app.add_option("--repeats", repeats, "Alternating measurements of each")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  runtime::init_logging("warn");

  const auto dir = (fs::temp_directory_path() / "longwave-bench-overhead").string();
  auto cfg = config::parse_config("", {}, "bench");
  cfg.run.mode = config::run_mode::single;
  cfg.run.out_dir = dir + "/run";
  cfg.model.preset = preset;
  cfg.model.seq_len = seq_len;
  cfg.train.workers = 1;
  cfg.train.batch_size = batch;
  cfg.train.threads = threads;
  cfg.train.inner_steps = steps;
  cfg.train.rounds = 1;
  cfg.train.grad_clip = 1.0;
  cfg.eval.batches = 1;
  cfg.checkpoint.every_rounds = 0;
  cfg.metrics.enabled = false;
  at::set_num_threads(static_cast<int>(threads));
  auto data = models::data::prepare_dataset(models::data::default_corpus_path(), cfg.data.tokenizer, 0,
                                            cfg.data.val_fraction, dir + "/run/data");
  std::printf(
      "settings: preset %s, batch %ld x seq_len %ld, %ld steps, %ld torch threads, %ld repeats, fp32\n",
      preset.c_str(), batch, seq_len, steps, threads, repeats);
  const double tokens = static_cast<double>(steps * batch * seq_len);
  std::vector<double> ratios, cpu_ratios;
  for (int64_t r = 0; r < repeats; ++r) {
    double c0 = cpu_seconds();
    const double plain = plain_loop(cfg, data.train_path);
    const double plain_cpu = tokens / (cpu_seconds() - c0);
    c0 = cpu_seconds();
    const double rt = runtime_run(cfg);  // its CPU time includes start-up, the final eval and checkpoint
    const double rt_cpu = tokens / (cpu_seconds() - c0);
    ratios.push_back(rt / plain);
    cpu_ratios.push_back(rt_cpu / plain_cpu);
    std::printf(
        "repeat %ld: plain %.0f tok/s, runtime %.0f tok/s, ratio %.3f | tokens per CPU-second ratio %.3f\n",
        r + 1, plain, rt, rt / plain, rt_cpu / plain_cpu);
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(cpu_ratios.begin(), cpu_ratios.end());
  std::printf("runtime tokens/s / plain tokens/s (median of %zu): %.3f  (goal >= 0.98)\n", ratios.size(),
              ratios[ratios.size() / 2]);
  std::printf("runtime / plain tokens per CPU-second (median): %.3f\n", cpu_ratios[cpu_ratios.size() / 2]);
  fs::remove_all(dir);
  return 0;
}
