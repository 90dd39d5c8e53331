// The actor runtime end to end, in process, on the bundled KJV corpus: equivalence with plain AdamW and
// the DiLoCo-beats-single-worker check.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "actors/training.hpp"
#include "config/config_loader.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/data/shard.hpp"
#include "models/data/window_sampler.hpp"
#include "models/gpt.hpp"
#include "models/lr_schedule.hpp"
#include "runtime/checkpoint_store.hpp"
#include "runtime/snapshot_codec.hpp"
#include "runtime/type_ids.hpp"
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

CATCH_TEST_CASE("with M=1 H=1 outer lr 1 and momentum 0 DiLoCo reproduces plain AdamW step for step",
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
  auto data =
      models::data::prepare_dataset(require_corpus(), "byte", 0, cfg.data.val_fraction, dir + "/data");
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
    const double lr =
        models::warmup_cosine_lr(cfg.train.lr, i, cfg.train.warmup_steps, 12, cfg.train.min_lr_ratio);
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

CATCH_TEST_CASE("on KJV the loss decreases and DiLoCo with 4 workers beats one worker at equal inner steps",
                "[integration][diloco]") {
  require_corpus();
  const auto dir = test::scratch_dir("diloco-vs-single");
  auto base = small_config("");
  base.model.seq_len = 128;
  base.train.batch_size = 8;
  base.train.inner_steps = 10;
  base.train.rounds = 20;  // 200 inner steps per worker
  base.train.warmup_steps = 20;
  // Short runs: outer Nesterov momentum 0.9 loses to one worker here (bench/RESULTS.md); plain averaging of
  // the replicas (outer lr 1, momentum 0) is the DiLoCo setting that wins at 200 steps.
  base.outer.lr = 1.0;
  base.outer.momentum = 0.0;
  base.train.threads = 0;  // cores / workers
  base.eval.every_rounds = 0;
  base.eval.batches = 16;
  actors::run_options opts;
  opts.fresh = true;
  opts.handle_signals = false;

  auto single = base;
  single.run.mode = "single";
  single.train.workers = 1;
  single.run.out_dir = dir + "/single";
  CATCH_REQUIRE(actors::run_training(single, opts) == 0);
  auto diloco = base;
  diloco.run.mode = "diloco";
  diloco.train.workers = 4;
  diloco.run.out_dir = dir + "/diloco";
  CATCH_REQUIRE(actors::run_training(diloco, opts) == 0);

  for (const auto& run : {single.run.out_dir, diloco.run.out_dir}) {
    auto trace = test::read_trace(run + "/loss_trace.tsv");
    CATCH_REQUIRE(trace.size() == 200);
    double first = 0, last = 0;
    for (size_t i = 0; i < 10; ++i) first += trace[i].second, last += trace[trace.size() - 1 - i].second;
    CATCH_CHECK(last < first * 0.7);  // mean of the last 10 steps well below the first 10
  }
  const double ppl_single = std::exp(final_val_loss(single.run.out_dir));
  const double ppl_diloco = std::exp(final_val_loss(diloco.run.out_dir));
  CATCH_INFO("val ppl single " << ppl_single << ", DiLoCo M=4 " << ppl_diloco);
  CATCH_CHECK(ppl_diloco < ppl_single);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("in single mode theta_global follows the one worker's weights", "[integration][single]") {
  require_corpus();
  const auto dir = test::scratch_dir("single-theta");
  auto cfg = small_config(dir);
  cfg.run.mode = "single";
  cfg.train.workers = 1;
  cfg.train.inner_steps = 5;
  cfg.train.rounds = 3;
  cfg.eval.every_rounds = 0;
  actors::run_options opts;
  opts.fresh = true;
  opts.handle_signals = false;
  CATCH_REQUIRE(actors::run_training(cfg, opts) == 0);
  runtime::checkpoint_store store(dir + "/checkpoints", 3);
  auto latest = store.load_latest();
  CATCH_REQUIRE(latest.has_value());
  auto spec = models::preset_spec("tiny", 256, cfg.model.seq_len);
  auto snap = runtime::from_checkpoint(std::move(*latest),
                                       {models::closed_form_param_count(spec), 1, "single", "tiny"});
  CATCH_CHECK(snap.round == 3);
  CATCH_CHECK((snap.theta - snap.replicas[0].master).abs().max().item<double>() < 1e-6);
  CATCH_CHECK(snap.theta.abs().sum().item<double>() > 0);
  std::filesystem::remove_all(dir);
}

namespace {

/// Hand-set pseudo-gradients of two workers in round r (1-based), over n parameters: worker 0 sends
/// 0.01*r + 0.001*(i mod 7), worker 1 sends -0.004*r + 0.002*(i mod 3). Their mean is what a communicator
/// that ignores the real contributions answers.
at::Tensor hand_average(uint64_t r, int64_t n) {
  auto i = torch::arange(n, torch::kFloat);
  auto a = 0.01f * static_cast<float>(r) + 0.001f * torch::fmod(i, 7);
  auto b = -0.004f * static_cast<float>(r) + 0.002f * torch::fmod(i, 3);
  return ((a + b) / 2).contiguous();
}

/// PyTorch SGD with Nesterov momentum, written out: b <- mu*b + d (b = d at first), theta -= lr*(d + mu*b).
struct hand_nesterov {
  double lr, mu;
  at::Tensor b;
  at::Tensor step(const at::Tensor& theta, const at::Tensor& d) {
    b = b.defined() ? b * mu + d : d.clone();
    return theta - lr * (d + mu * b);
  }
};

/// Runs `rounds` rounds of 2 workers with the hand-set averages and returns theta_global after each round,
/// read from the per-round checkpoints, and the pending average each holds.
std::vector<runtime::train_snapshot> run_with_hand_deltas(const std::string& dir, const std::string& policy,
                                                          int64_t rounds) {
  auto cfg = small_config(dir);
  cfg.run.mode = "diloco";
  cfg.diloco.outer = policy;
  cfg.train.workers = 2;
  cfg.train.inner_steps = 1;
  cfg.train.rounds = rounds;
  cfg.eval.every_rounds = 0;
  cfg.eval.batches = 1;
  cfg.checkpoint.every_rounds = 1;
  cfg.checkpoint.keep = rounds + 1;
  auto spec = models::preset_spec("tiny", 256, cfg.model.seq_len);
  const int64_t n = models::closed_form_param_count(spec);
  actors::run_options opts;
  opts.fresh = true;
  opts.handle_signals = false;
  opts.communicator_override = [n](caf::actor_system& sys) {
    return sys.spawn([n](caf::event_based_actor*) -> caf::behavior {
      return {[n](runtime::reduce_atom, uint64_t round,
                  std::vector<at::Tensor> parts) -> caf::result<at::Tensor> {
        if (parts.size() != 2 || parts[0].numel() != n)
          return caf::make_error(errc::malformed_frame, "parts");
        return hand_average(round, n);
      }};
    });
  };
  CATCH_REQUIRE(actors::run_training(cfg, opts) == 0);
  runtime::checkpoint_store store(dir + "/checkpoints", rounds + 1);
  std::vector<runtime::train_snapshot> out;
  for (const auto& f : store.list())
    out.push_back(
        runtime::from_checkpoint(runtime::checkpoint_store::load_file(f), {n, 2, "diloco", "tiny"}));
  CATCH_REQUIRE(out.size() == static_cast<size_t>(rounds));
  return out;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

CATCH_TEST_CASE("delayed applies each round's average one round late, and the last one before the end",
                "[integration][diloco][policy]") {
  require_corpus();
  const auto dir = test::scratch_dir("delayed-hand");
  const int64_t rounds = 4;
  auto snaps = run_with_hand_deltas(dir + "/delayed", "delayed", rounds);
  auto spec = models::preset_spec("tiny", 256, 64);
  const int64_t n = models::closed_form_param_count(spec);
  // By hand: theta^1 = theta^0 (round 1 has no earlier average), theta^t = step(theta^(t-1), D^(t-1)), and
  // the last round's average is applied at the end: the round-4 checkpoint holds step(theta^4, D^4).
  hand_nesterov opt{0.7, 0.9, {}};
  auto theta = models::gpt::init_flat(spec, 1234);
  std::vector<at::Tensor> want;
  want.push_back(theta);  // after round 1
  for (uint64_t t = 2; t <= static_cast<uint64_t>(rounds); ++t)
    want.push_back(theta = opt.step(theta, hand_average(t - 1, n)));
  want.back() = opt.step(want.back(), hand_average(rounds, n));
  for (int64_t t = 0; t < rounds; ++t) {
    CATCH_INFO("round " << t + 1);
    CATCH_CHECK(snaps[t].round == static_cast<uint64_t>(t + 1));
    CATCH_CHECK(max_diff(snaps[t].theta, want[t]) < 1e-6);
    if (t + 1 < rounds) {
      // Each checkpoint carries the average its next outer step applies, so a resume continues exactly.
      CATCH_REQUIRE(snaps[t].pending.defined());
      CATCH_CHECK(snaps[t].pending_round == static_cast<uint64_t>(t + 1));
      CATCH_CHECK(max_diff(snaps[t].pending, hand_average(t + 1, n)) < 1e-7);
    } else {
      CATCH_CHECK_FALSE(snaps[t].pending.defined());
    }
  }

  // The same averages under sync give the classic sequence (and a different one).
  auto sync = run_with_hand_deltas(dir + "/sync", "sync", rounds);
  hand_nesterov sopt{0.7, 0.9, {}};
  auto stheta = models::gpt::init_flat(spec, 1234);
  for (int64_t t = 0; t < rounds; ++t) {
    stheta = sopt.step(stheta, hand_average(static_cast<uint64_t>(t + 1), n));
    CATCH_INFO("sync round " << t + 1);
    CATCH_CHECK(max_diff(sync[t].theta, stheta) < 1e-6);
    CATCH_CHECK_FALSE(sync[t].pending.defined());
  }
  CATCH_CHECK(max_diff(sync[1].theta, snaps[1].theta) > 1e-3);
  std::filesystem::remove_all(dir);
}
