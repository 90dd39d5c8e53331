// Config -> inner-loop options, and the start-up check that the run fits in memory.
#include "actors/run_context.hpp"

#include <fmt/format.h>

#include <cmath>

#include "config/config_loader.hpp"
#include "models/model_spec.hpp"
#include "runtime/memory/allocator.hpp"

namespace longwave::actors {

models::inner_options make_inner_options(const config::train_config& cfg) {
  models::inner_options o;
  o.batch_size = cfg.train.batch_size;
  o.lr = cfg.train.lr;
  o.warmup_steps = cfg.train.warmup_steps;
  o.total_steps = cfg.train.rounds * cfg.train.inner_steps;
  o.min_lr_ratio = cfg.train.min_lr_ratio;
  o.grad_clip = cfg.train.grad_clip;
  o.adam.beta1 = cfg.train.beta1;
  o.adam.beta2 = cfg.train.beta2;
  o.adam.eps = cfg.train.eps;
  o.adam.weight_decay = cfg.train.weight_decay;
  o.bf16 = cfg.model.dtype == config::model_dtype::bf16;
  o.micro_batches = cfg.train.micro_batches;
  return o;
}

runtime::json_line start_record(const run_context& ctx, int64_t resumed_step, uint64_t resumed_round) {
  const auto& c = ctx.cfg;
  runtime::json_line line("start");
  line.add("node", c.run.name)
      .add("mode", config::to_string(c.run.mode))
      .add("preset", ctx.spec.preset)
      .add("params", models::closed_form_param_count(ctx.spec))
      .add("workers", ctx.n_workers())
      .add("cluster_workers", ctx.global_workers())
      .add("rounds", c.train.rounds)
      .add("inner_steps", c.train.inner_steps)
      .add("batch_size", c.train.batch_size)
      .add("seq_len", ctx.spec.seq_len)
      .add("inner_lr", c.train.lr)
      .add("outer_lr", c.outer.lr)
      .add("outer_momentum", c.outer.momentum)
      .add("comm_dtype", config::to_string(c.comm.dtype))
      .add("clients_per_round", c.federated.clients_per_round)
      .add("resumed_step", resumed_step)
      .add("resumed_round", resumed_round)
      .add("planned_steps", ctx.planned_steps)
      .add("joined", static_cast<bool>(ctx.recovery));  // a running cluster's state fetched
  return line;
}

runtime::json_line eval_record(uint64_t round, int64_t step, double loss) {
  runtime::json_line line("eval");
  line.add("round", round).add("step", step).add("val_loss", loss).add("val_ppl", std::exp(loss));
  return line;
}

runtime::json_line end_record(int code, double loss, double seconds, int64_t steps, uint64_t rounds) {
  runtime::json_line line("end");
  line.add("exit_code", code)
      .add("val_loss", loss)
      .add("val_ppl", std::exp(loss))
      .add("seconds", seconds)
      .add("steps", steps)
      .add("rounds", rounds);
  return line;
}

bool averages_plain_deltas(const config::train_config& cfg) {
  using config::outer_policy_kind;
  const auto outer = cfg.diloco.outer;
  return cfg.run.mode == config::run_mode::diloco &&
         (outer == outer_policy_kind::sync || outer == outer_policy_kind::delayed ||
          outer == outer_policy_kind::streaming);
}

bool run_context::mean_on_device() const {
  if (!averages_plain_deltas(cfg) || !devices.any_cuda() || devices.workers.empty()) return false;
  for (const auto& d : devices.workers)
    if (d != devices.workers.front()) return false;
  return true;
}

models::inner_options run_context::inner_of(int64_t rank) const {
  auto o = inner;
  if (rank < static_cast<int64_t>(devices.workers.size()))
    o.device = devices.workers[static_cast<size_t>(rank)];
  o.device_delta = mean_on_device();
  o.autocast = models::resolve_autocast(cfg.train.autocast, o.device) == config::autocast_mode::bf16;
  return o;
}

std::vector<models::data::token_span> run_context::data_spans(int64_t global_rank) const {
  return models::data::partition_spans(cfg.data.partition, static_cast<int64_t>(train_tokens->size()),
                                       train_docs, global_rank, data_parts(), spec.seq_len + 1);
}

void check_eval_memory_fits(const config::train_config& cfg, const models::model_spec& spec) {
  const int64_t machine = runtime::physical_memory_bytes();
  const double need = static_cast<double>(models::evaluation_memory_bytes(
      spec, cfg.train.batch_size, cfg.model.dtype == config::model_dtype::bf16));
  if (machine <= 0 || need <= static_cast<double>(machine)) return;
  constexpr double mib = 1 << 20;
  throw config::config_error(
      "train.batch_size",
      fmt::format(
          "eval: the checkpoint's model {} ({} parameters) at its train.batch_size = {} and "
          "model.seq_len = {} needs about {:.1f} MiB to evaluate, more than this machine's {:.1f} MiB "
          "of memory",
          models::model_label(spec), models::closed_form_param_count(spec), cfg.train.batch_size,
          spec.seq_len, need / mib, static_cast<double>(machine) / mib));
}

std::string memory_advice(const config::train_config& cfg, int64_t seq_len, bool gpu) {
  std::vector<std::string> knobs;
  if (cfg.train.batch_size > 1) knobs.push_back("lower train.batch_size");
  if (gpu && cfg.train.micro_batches < cfg.train.batch_size)
    knobs.push_back(fmt::format("raise train.micro_batches (now {})", cfg.train.micro_batches));
  if (cfg.train.workers > 1) knobs.push_back(gpu ? "use fewer workers per GPU" : "lower train.workers");
  if (seq_len > 1) knobs.push_back("lower model.seq_len");
  std::string out;
  for (size_t i = 0; i < knobs.size(); ++i) out += (i == 0 ? "" : ", ") + knobs[i];
  return out + (out.empty() ? "use" : ", or use") +
         " a smaller model.preset or shape (model.dim, model.layers, ...)";
}

void check_memory_fits(const config::train_config& cfg, const models::model_spec& spec) {
  const int64_t machine = runtime::physical_memory_bytes();
  if (machine <= 0) return;
  const bool bf16 = cfg.model.dtype == config::model_dtype::bf16;
  const double per_worker =
      static_cast<double>(models::training_memory_bytes(spec, cfg.train.batch_size, bf16));
  const double need = models::process_memory_bytes(spec, cfg.train.batch_size, bf16, cfg.train.workers);
  if (need <= static_cast<double>(machine)) return;
  constexpr double mib = 1 << 20;
  throw config::config_error(
      "train.batch_size",
      fmt::format("train.batch_size = {}: the memory estimate is {:.1f} MiB ({:.1f} MiB per worker x {} "
                  "workers and theta_global's copies, model {}, model.seq_len {}), more than this machine's "
                  "{:.1f} MiB of memory; {}",
                  cfg.train.batch_size, need / mib, per_worker / mib, cfg.train.workers,
                  models::model_label(spec), spec.seq_len, static_cast<double>(machine) / mib,
                  memory_advice(cfg, spec.seq_len, false)));
}

}  // namespace longwave::actors
