// The coordinator's progress lines, metrics and result.json: what a run reports, apart from how it runs.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "actors/cluster_link.hpp"
#include "actors/coordinator/state.hpp"
#include "actors/run_files.hpp"
#include "models/gpu_info.hpp"
#include "models/lr_schedule.hpp"
#include "models/model_spec.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/files/atomic_file.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors::coordinator_parts {

using namespace longwave::runtime;

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void gauge(self_ptr self, const char* name, double v, const std::string& worker) {
  self->send(self->state.peers.metrics, gauge_atom_v, std::string(name), worker, v);
}

double since_start(const coordinator_state& s) {
  return std::chrono::duration<double>(clock::now() - s.t_start).count();
}

void record(self_ptr self, const json_line& line) {
  self->send(self->state.peers.metrics, record_atom_v, line.str());
}

uint32_t theta_crc(const at::Tensor& theta) {
  // At every round boundary, before the next round starts; a model-sized CRC is memory-bound on one thread.
  const auto flat = theta.contiguous();
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1U, 8U);
  return crc32c_parallel(flat.data_ptr(), static_cast<size_t>(flat.numel()) * flat.element_size(), threads);
}

void record_round(self_ptr self, const at::Tensor& theta) {
  auto& s = self->state;
  const uint32_t crc = theta_crc(theta);
  auto line = json_line("round");
  line.add("round", s.round).add("step", s.last_step).add("theta_crc32c", fmt::format("{:08x}", crc));
  // Where the round's time went, as the coordinator saw it: each phase's seconds since the last round record
  // (the current one, the outer step, up to now). On a node: "inner_s" is until the last worker's reply.
  s.count_phase_time();
  for (const auto p : {phase::inner, phase::reducing, phase::outer_step, phase::evaluating, phase::saving})
    if (const double secs = s.phase_secs[static_cast<size_t>(p)]; secs > 0)
      line.add(fmt::format("{}_s", to_string(p)), secs);
  s.phase_secs.fill(0);
  // diloco.adaptive_steps: the steps this node ran in the round, and its measured step time.
  if (s.ctx->cfg.diloco.adaptive_steps)
    line.add("inner_steps", s.round_steps).add("step_seconds", s.step_seconds);
  record(self, line);
  s.ctx->cluster->round_committed(s.round, crc);
}

void record_start(self_ptr self) {
  const auto& s = self->state;
  record(self, start_record(*s.ctx, s.resume ? static_cast<int64_t>(s.resume->step) : int64_t{0},
                            s.resume ? s.resume->round : uint64_t{0}));
  if (const auto& j = s.ctx->recovery) {
    // Joined a running cluster: the membership it entered, and how it got the state.
    record(self, json_line("membership")
                     .add("epoch", j->epoch)
                     .add("rank", static_cast<uint64_t>(j->rank))
                     .add("members", j->members)
                     .add("kept_round", j->round)
                     .add("kept_fragment", uint64_t{0}));
    record(self, json_line("recovery")
                     .add("round", j->round)
                     .add("epoch", j->epoch)
                     .add("source", j->source)
                     .add("bytes", j->bytes)
                     .add("seconds", j->seconds));
    gauge(self, "longwave_cluster_recovery_bytes", static_cast<double>(j->bytes));
    gauge(self, "longwave_cluster_recovery_seconds", j->seconds);
  }
}

namespace {

/// Model FLOP/s utilization of a worker on GPU `device` ("cuda:N") at `tokens_per_s`: 6·N·tokens/s over the
/// GPU's dense bf16 peak (6N leaves attention out); NaN for a GPU not in models::dense_bf16_peak_flops.
double model_flops_utilization(const run_context& ctx, const std::string& device, double tokens_per_s) {
  const double peak = models::dense_bf16_peak_flops(std::stoi(device.substr(5)));
  const double n = static_cast<double>(models::closed_form_param_count(ctx.spec));
  return peak > 0 ? 6 * n * tokens_per_s / peak : std::numeric_limits<double>::quiet_NaN();
}

/// A GPU worker's step: device seconds, memory, and its utilization of the GPU's peak.
void on_gpu_report(self_ptr self, const step_report& r, double worker_tokens_per_s) {
  auto& s = self->state;
  const std::string w = std::to_string(r.rank);
  const auto wi = static_cast<size_t>(r.rank);
  s.round_gpu_s[wi] = std::max(0.0, s.round_gpu_s[wi]) + r.gpu_s;
  s.gpu_peak[wi] = std::max(s.gpu_peak[wi], r.gpu_peak);
  self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_gpu_busy_seconds_total"), w,
             r.gpu_s);
  gauge(self, "longwave_worker_gpu_memory_allocated_bytes", static_cast<double>(r.gpu_allocated), w);
  gauge(self, "longwave_worker_gpu_memory_reserved_bytes", static_cast<double>(r.gpu_reserved), w);
  gauge(self, "longwave_worker_gpu_memory_peak_bytes", static_cast<double>(r.gpu_peak), w);
  const double mfu = model_flops_utilization(*s.ctx, s.ctx->devices.workers.at(wi), worker_tokens_per_s);
  if (std::isfinite(mfu)) gauge(self, "longwave_worker_model_flops_utilization_ratio", mfu, w);
}

}  // namespace

void on_report(self_ptr self, const step_report& r) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const std::string w = std::to_string(r.rank);
  const auto wi = static_cast<size_t>(r.rank);
  const double wall = since_start(s);
  LW_ASSERT(wi < s.run_compute.size(), "step report from a worker this node does not have");
  s.round_compute[wi] += r.compute_s;
  s.run_compute[wi] += r.compute_s;
  s.worker_tokens[wi] += r.tokens;
  const double worker_tokens_per_s = wall > 0 ? s.worker_tokens[wi] / wall : 0;
  gauge(self, "longwave_worker_tokens_per_second", worker_tokens_per_s, w);
  if (r.gpu_s >= 0) on_gpu_report(self, r, worker_tokens_per_s);
  gauge(self, "longwave_worker_compute_utilization_run_ratio", wall > 0 ? s.run_compute[wi] / wall : 0, w);
  gauge(self, "longwave_worker_train_loss", r.loss, w);
  self->send(s.peers.metrics, observe_atom_v, std::string("longwave_worker_inner_step_seconds"), w,
             r.compute_s);
  self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_inner_steps_total"), w, 1.0);
  self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_tokens_total"), w,
             static_cast<double>(r.tokens));
  auto& agg = s.steps[r.step];
  agg.count++;
  agg.loss_sum += r.loss;
  if (agg.count < (s.reporting_workers > 0 ? s.reporting_workers : s.ctx->n_workers())) return;
  const double loss = agg.loss_sum / static_cast<double>(agg.count);
  s.steps.erase(r.step);
  const int64_t step = r.step - s.step_offset;  // this node's own (r.step is Adam's count)
  s.last_step = std::max(s.last_step, step);
  if (s.trace) {
    s.trace << step << '\t' << s.round << '\t' << fmt::format("{:.9g}", loss) << '\n' << std::flush;
    if (!s.trace)  // said once: the failed stream writes no more
      spdlog::warn(
          "cannot write {} at inner step {} (a full disk?): the loss trace stops here; training, "
          "its checkpoints and metrics.jsonl go on",
          s.trace_path, step);
  }
  const double tok_s = wall > 0 ? static_cast<double>(s.session_tokens()) / wall : 0;
  const double busy = wall * static_cast<double>(s.ctx->n_workers());
  const int64_t total = s.ctx->planned_steps;
  // The rate the step just taken used: the schedule follows Adam's count (1-based here, 0-based there). Under
  // client sampling, at the run's average pace (a client's own count runs over its share).
  const double lr = models::warmup_cosine_lr(cfg.train.lr, r.step - 1, cfg.train.warmup_steps, total,
                                             cfg.train.min_lr_ratio);
  gauge(self, "longwave_train_loss", loss);
  gauge(self, "longwave_train_tokens_per_second", tok_s);
  gauge(self, "longwave_compute_utilization_ratio", busy > 0 ? s.total_compute() / busy : 0);
  gauge(self, "longwave_inner_learning_rate", lr);
  record(self, json_line("step")
                   .add("step", step)
                   .add("round", s.round + 1)
                   .add("loss", loss)
                   .add("tokens_per_second", tok_s)
                   .add("lr", lr));
  if (!s.policy->shares_rounds()) {
    // async: a node's rounds are its own phases, as many as its speed allows; the run ends at a version.
    if (step % cfg.runtime.log_every_steps == 0)
      spdlog::info("phase {:>3} | version {:>3}/{} | step {:>5} | loss {:.4f} | {:>7.0f} tok/s", s.round + 1,
                   s.version, cfg.train.rounds, step, loss, tok_s);
  } else if (step % cfg.runtime.log_every_steps == 0 || step == total) {
    const double done = static_cast<double>(step - s.first_step);
    const double eta = done > 0 ? wall / done * static_cast<double>(total - step) : NAN;
    spdlog::info("round {:>3}/{} | step {:>5}/{} | loss {:.4f} | {:>7.0f} tok/s | eta {}",
                 std::min<uint64_t>(s.round + 1, cfg.train.rounds), cfg.train.rounds, step, total, loss,
                 tok_s, format_duration(eta));
  }
}

/// Per-worker accounting of the round that just ended: its wall time runs from the previous round's end, so
/// the all-reduce, the outer step, evaluation and checkpoint hand-off all count as idle.
void account_round(self_ptr self) {
  auto& s = self->state;
  const auto now = clock::now();
  const double wall = std::chrono::duration<double>(now - s.t_round_start).count();
  s.t_round_start = now;
  for (size_t i = 0; i < s.round_compute.size(); ++i) {
    const std::string w = std::to_string(i);
    const double compute = s.round_compute[i];
    const double idle = std::max(0.0, wall - compute);
    const double util = wall > 0 ? std::min(1.0, compute / wall) : 0;
    const double staleness = s.policy->staleness();
    gauge(self, "longwave_worker_compute_utilization_ratio", util, w);
    gauge(self, "longwave_worker_staleness_rounds", staleness, w);
    self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_idle_seconds_total"), w, idle);
    self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_stall_seconds_total"), w,
               s.round_stall_s);
    auto line = json_line("worker")
                    .add("round", s.round)
                    .add("worker", static_cast<int64_t>(i))
                    .add("compute_s", compute)
                    .add("wall_s", wall)
                    .add("idle_s", idle)
                    .add("stall_s", s.round_stall_s)
                    .add("utilization", util)
                    .add("staleness", staleness)
                    .add("tokens", s.run_tokens(i));
    if (const auto& h = s.round_host[i]; h.round > 0) {
      // The idle split: the worker's round outside its steps (theta's load, the pseudo-gradient, the gaps
      // between steps) and the wall time it had no round (the node's boundary).
      line.add("load_s", h.load)
          .add("delta_s", h.delta)
          .add("gaps_s", std::max(0.0, h.round - compute - h.load - h.delta))
          .add("boundary_s", std::max(0.0, wall - h.round));
      s.round_host[i] = {};
    }
    if (s.round_gpu_s[i] >= 0) {  // a GPU worker: its device's busy time and memory over the round
      const double run_wall = since_start(s);
      const double mfu = model_flops_utilization(*s.ctx, s.ctx->devices.workers.at(i),
                                                 run_wall > 0 ? s.worker_tokens[i] / run_wall : 0);
      line.add("gpu_busy_s", s.round_gpu_s[i])
          .add("gpu_utilization", wall > 0 ? std::min(1.0, s.round_gpu_s[i] / wall) : 0.0)
          .add("gpu_memory_peak_bytes", s.gpu_peak[i]);
      if (std::isfinite(mfu)) line.add("mfu", mfu);
      s.round_gpu_s[i] = 0;
    }
    record(self, std::move(line));
    s.round_compute[i] = 0;
  }
  s.round_stall_s = 0;
}

/// One evaluation's result, for theta as it was after `round` (inner step `step`; async: at `version`).
void on_eval(self_ptr self, uint64_t round, uint64_t version, int64_t step, double loss) {
  auto& s = self->state;
  s.last_val_loss = loss;
  gauge(self, "longwave_val_loss", loss);
  gauge(self, "longwave_val_perplexity", std::exp(loss));
  record(self, eval_record(round, step, loss));
  if (!s.policy->shares_rounds())  // async: a node's rounds are its phases; the run counts versions
    spdlog::info("eval  phase {:>3} | version {:>3}/{} | val loss {:.4f} | val ppl {}", round, version,
                 s.ctx->cfg.train.rounds, loss, readable(std::exp(loss), 3));
  else
    spdlog::info("eval  {:>3}/{} | val loss {:.4f} | val ppl {}", round, s.ctx->cfg.train.rounds, loss,
                 readable(std::exp(loss), 3));
}

// result.json in out_dir: the numbers a sweep or a test reads back, one "key": value per line. A loss or
// perplexity that is not finite (no evaluation, or a diverged one) is null: JSON has no NaN, and
// metrics.jsonl writes null too.
std::string write_result(const coordinator_state& s, double wall) {
  return write_result_file(
      s.ctx->cfg, run_result{s.round, s.last_step, s.last_val_loss, s.total_tokens(), wall, wall - s.eval_s});
}

}  // namespace longwave::actors::coordinator_parts
