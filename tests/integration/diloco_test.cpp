// The actor runtime end to end, in process, on the bundled KJV corpus: equivalence with plain AdamW and
// the DiLoCo-beats-single-worker check.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "actors/training.hpp"
#include "config/config_loader.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/data/shard.hpp"
#include "models/data/window_sampler.hpp"
#include "models/gpt.hpp"
#include "models/lr_schedule.hpp"
#include "tests/support/process.hpp"

using namespace longwave;

namespace {

config::train_config small_config(const std::string& out_dir) {
  auto cfg = config::parse_config("", {}, "test");
  cfg.run.out_dir = out_dir;
  cfg.metrics.enabled = false;
  cfg.model.seq_len = 64;
  cfg.train.batch_size = 4;
  cfg.train.threads = 1;
  cfg.eval.batches = 4;
  cfg.checkpoint.every_rounds = 0;
  return cfg;
}

std::string require_corpus() {
  const auto path = actors::default_corpus_path();
  if (!std::filesystem::exists(path)) CATCH_FAIL("default corpus " << path << " missing: run scripts/setup");
  return path;
}

// val_loss from the run's result.json.
double final_val_loss(const std::string& out_dir) {
  const auto text = test::read_text(out_dir + "/result.json");
  const auto pos = text.find("\"val_loss\":");
  CATCH_REQUIRE(pos != std::string::npos);
  return std::stod(text.substr(pos + 11));
}

}  // namespace

CATCH_TEST_CASE("M=1, H=1, outer lr 1 and momentum 0 reproduce plain AdamW training step for step",
                "[integration][diloco]") {
  require_corpus();
  const auto dir = test::scratch_dir("adamw-equiv");
  auto cfg = small_config(dir);
  cfg.run.mode = "diloco";
  cfg.train.workers = 1;
  cfg.train.inner_steps = 1;
  cfg.train.rounds = 12;
  cfg.train.warmup_steps = 3;
  cfg.train.grad_clip = 0;
  cfg.outer.lr = 1.0;
  cfg.outer.momentum = 0.0;
  cfg.eval.every_rounds = 0;
  actors::run_options opts;
  opts.fresh = true;
  opts.handle_signals = false;
  CATCH_REQUIRE(actors::run_training(cfg, opts) == 0);
  auto trace = test::read_trace(dir + "/loss_trace.tsv");
  CATCH_REQUIRE(trace.size() == 12);

  // The same model, data and schedule in a plain LibTorch loop with torch::optim::AdamW.
  at::set_num_threads(1);
  auto data = models::data::prepare_dataset(require_corpus(), "byte", 0, cfg.data.val_fraction, dir + "/data");
  auto tokens = std::make_shared<const std::vector<uint16_t>>(models::data::read_shard(data.train_path));
  auto spec = models::preset_spec("tiny", 256, cfg.model.seq_len);
  models::gpt model(spec, at::kFloat);
  model.load_flat(models::gpt::init_flat(spec, cfg.run.seed));
  torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(cfg.train.lr)
                                                  .betas({cfg.train.beta1, cfg.train.beta2})
                                                  .eps(cfg.train.eps)
                                                  .weight_decay(cfg.train.weight_decay));
  models::data::window_sampler sampler(tokens, 0, 1, cfg.train.batch_size, cfg.model.seq_len, cfg.run.seed);
  std::vector<int64_t> buf(static_cast<size_t>(cfg.train.batch_size * (cfg.model.seq_len + 1)));
  for (int64_t i = 0; i < 12; ++i) {
    const double lr = models::warmup_cosine_lr(cfg.train.lr, i, cfg.train.warmup_steps, 12, cfg.train.min_lr_ratio);
    static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options()).lr(lr);
    sampler.next(buf);
    auto batch = torch::from_blob(buf.data(), {cfg.train.batch_size, cfg.model.seq_len + 1}, torch::kLong);
    model.zero_grad();
    const double loss = model.loss(batch, true).item<double>();
    opt.step();
    CATCH_CHECK(trace[static_cast<size_t>(i)].first == i + 1);
    CATCH_CHECK(std::abs(trace[static_cast<size_t>(i)].second - loss) < 1e-6);
  }
  std::filesystem::remove_all(dir);
}
