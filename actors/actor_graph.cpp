// The actor graph of one run: who gets spawned with what, and the main thread's wait for the end.
#include "actors/actor_graph.hpp"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <caf/scoped_actor.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "actors/checkpointer.hpp"
#include "actors/collective_factory.hpp"
#include "actors/communicator.hpp"
#include "actors/evaluator.hpp"
#include "actors/metrics_sink.hpp"
#include "actors/outer_optimizer.hpp"
#include "actors/round/adaptive_steps.hpp"
#include "actors/run_setup.hpp"
#include "models/gpt.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"
#include "runtime/process/stop_signals.hpp"

namespace fs = std::filesystem;

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

std::atomic<int> g_signals{0};      // Ctrl-C and SIGTERM: the first stops with a checkpoint, a second exits
std::atomic<bool> g_hangup{false};  // SIGHUP (the terminal closed; often sent twice): a stop, never an exit
bool g_watch_pipes = false;         // SIGPIPE was not ignored when the run began: a closed output stops it

/// Whether standard output or error is a pipe or socket whose reader is gone (`| head` that ended, a killed
/// `tee` or `longwave launch`): the run then stops as for a hangup, instead of dying of SIGPIPE unsaved.
bool output_closed() {
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) continue;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0) return true;
  }
  return false;
}

constexpr int stop_signals[3] = {SIGINT, SIGTERM, SIGHUP};
void (*g_setup_before[3])(int) = {SIG_DFL, SIG_DFL, SIG_DFL};  // the handlers setup_signals replaced
bool g_setup_active = false;

void on_setup_signal(int /*sig*/) {
  static constexpr char line[] =
      "\nlongwave: stopped before training began: nothing to save (the same command starts again)\n";
  (void)!::write(STDERR_FILENO, line, sizeof line - 1);
  std::_Exit(130);
}

void on_signal(int sig) {
  std::signal(SIGPIPE, SIG_IGN);  // a log reader that went with the terminal must not kill the checkpoint
  if (sig == SIGHUP)
    g_hangup.store(true);
  else
    g_signals.fetch_add(1);
}

}  // namespace

setup_signals::setup_signals(bool enabled) {
  if (!enabled) return;
  for (int i = 0; i < 3; ++i)
    if ((g_setup_before[i] = std::signal(stop_signals[i], on_setup_signal)) == SIG_IGN)
      std::signal(stop_signals[i], SIG_IGN);
  g_setup_active = true;
}

setup_signals::~setup_signals() {
  if (!g_setup_active) return;  // never installed, or run_until_done took over
  for (int i = 0; i < 3; ++i)
    std::signal(stop_signals[i], g_setup_before[i] == SIG_ERR ? SIG_DFL : g_setup_before[i]);
  g_setup_active = false;
}

namespace {

/// Logs rejected frames (the first 50, then every 1000th) and counts them by reason.
comm::ring_allreduce::reject_callback rejection_logger(metrics_actor metrics) {
  auto count = std::make_shared<std::atomic<uint64_t>>(0);
  return [metrics, count](const std::string& peer, const std::string& why) {
    const auto n = count->fetch_add(1) + 1;
    if (n <= 50 || n % 1000 == 0)
      spdlog::warn("comm: dropped a frame from {}: {}{}", peer, why,
                   n == 50 ? " (further rejections are logged every 1000th)" : "");
    const auto colon = why.find(':');
    caf::anon_send(metrics, count_atom_v, std::string("longwave_comm_rejected_frames_total"),
                   "reason=" + why.substr(0, colon), 1.0);
  };
}

/// The metrics sink: /metrics (if enabled) and metrics.jsonl, with every worker and peer series made.
metrics_actor spawn_metrics(caf::actor_system& sys, const config::train_config& cfg, const run_paths& p,
                            const run_options& opts, const ring_place* place, int corrupt_checkpoints) {
  metrics_sink_options o;
  o.port = cfg.metrics.enabled ? static_cast<int>(cfg.metrics.port) : -1;
  o.address = cfg.metrics.address;
  o.node = place ? place->name() : (cfg.run.name.empty() ? std::string("local") : cfg.run.name);
  for (int64_t w = 0; w < cfg.train.workers; ++w) o.workers.push_back(std::to_string(w));
  if (place)
    for (size_t i = 0; i < place->names.size(); ++i)
      if (static_cast<int>(i) != place->rank) o.peers.push_back(place->names[i]);
  o.jsonl_path = (fs::path(p.out_dir) / "metrics.jsonl").string();
  if (opts.fresh) {
    std::error_code ec;
    fs::remove(o.jsonl_path, ec);
  }
  int port = -1;
  auto metrics = spawn_metrics_sink(sys, o, &port);
  if (port >= 0) spdlog::info("metrics: http://{}:{}/metrics", cfg.metrics.address, port);
  if (corrupt_checkpoints > 0)
    caf::anon_send(metrics, count_atom_v, std::string("longwave_errors_total"),
                   std::string("reason=checkpoint_corrupt"), static_cast<double>(corrupt_checkpoints));
  caf::anon_send(metrics, gauge_atom_v, std::string("longwave_cluster_peers_alive"), std::string(),
                 static_cast<double>(place ? place->names.size() : 1));
  return metrics;
}

/// How comm.dtype = "sparse" sends its values, for the start-up line.
std::string sparse_values(const config::train_config& cfg) {
  if (cfg.comm.sparse_indices == config::sparse_index_mode::shared)
    return "shared indices, values as int8 on the ring";
  return fmt::format("top-k at {} bits", cfg.comm.value_bits);
}

/// The communicator's options: one process is one node on a ring of one rank, a cluster node reduces across
/// nodes through comm.backend.
communicator_options communicator_options_for(const config::train_config& cfg, cluster_link& cluster,
                                              const metrics_actor& metrics) {
  const ring_place* place = cluster.place();
  communicator_options o;
  o.metrics = metrics;
  o.log_events = cfg.run.mode != config::run_mode::ddp;
  o.reduction = reduction_options_from(cfg);
  const std::string coding =
      cfg.comm.dtype == config::wire_dtype::sparse
          ? fmt::format("sparse at density {}, {}, error feedback decay {}{}", cfg.comm.density,
                        sparse_values(cfg), cfg.comm.ef_decay,
                        cfg.comm.robust_clip ? ", clipped to the median norm" : "")
          : fmt::format(
                "{}{}{}", cfg.comm.dtype,
                cfg.comm.dtype == config::wire_dtype::int8 && cfg.comm.int8_codebook ? " codebook" : "",
                // fp32 loses nothing to feed back: the setting is ignored there
                cfg.comm.error_feedback && cfg.comm.dtype != config::wire_dtype::fp32 ? ", error feedback"
                                                                                      : "");
  // Shared indices quantize in the chunks of the ring's int8 (NCCL has none).
  if (cfg.comm.dtype == config::wire_dtype::sparse &&
      (!place || cfg.comm.backend == config::comm_backend::ring)) {
    auto int8_ring = ring_options_from(cfg, 0);
    int8_ring.dtype = config::wire_dtype::int8;
    o.reduction.shared_chunk = comm::elements_per_chunk(int8_ring);
  }
  if (!place) {
    o.local = ring_options_from(cfg, 0);
    if (cfg.comm.dtype != config::wire_dtype::fp32 && cfg.run.mode != config::run_mode::single)
      spdlog::info("comm: one process is one node: the workers' mean {} is coded as a node sends it ({})",
                   cfg.run.mode == config::run_mode::ddp ? "gradient" : "pseudo-gradient", coding);
    return o;
  }
  o.collective = cluster.collective(cfg, rejection_logger(metrics));
  o.observe_round = place->observe_round;
  const auto world = place->names.size();
  o.next_peer = place->names[(static_cast<size_t>(place->rank) + 1) % world];
  o.prev_peer = place->names[(static_cast<size_t>(place->rank) + world - 1) % world];
  spdlog::info("{}: rank {} of {}, listening on {}, sending to {} ({} on the wire)", cfg.comm.backend,
               place->rank, world, place->endpoints[static_cast<size_t>(place->rank)], o.next_peer, coding);
  return o;
}

/// The outer optimizer: theta_0, [outer], and the policy's extra state (streaming's fragments, eager's
/// per-worker replicas). single: theta_global just follows the one worker (theta - 1.0 * (theta -
/// theta_local)); [outer] is unused.
outer_actor spawn_outer(caf::actor_system& sys, const run_context& ctx, const metrics_actor& metrics,
                        const std::shared_ptr<comm::collective>& collective) {
  const auto& cfg = ctx.cfg;
  config::outer_section outer_cfg = cfg.outer;
  if (cfg.run.mode == config::run_mode::single) outer_cfg = config::outer_section{1.0, 0.0, false};
  outer_policy policy;
  policy.fragments = ctx.fragments;
  if (cfg.run.mode == config::run_mode::diloco && cfg.diloco.outer == config::outer_policy_kind::eager) {
    policy.eager_replicas = cfg.train.workers;
    policy.global_workers = ctx.global_workers();
    // The average's weight counts workers, unless adaptive steps weigh nodes by tokens: then the notes do.
    if (collective && cfg.diloco.adaptive_steps)
      policy.live_workers = [collective] { return contributing_workers(collective->notes()); };
    else if (collective)
      policy.live_workers = [collective] { return collective->last_total_weight(); };
  }
  if (cfg.run.mode == config::run_mode::diloco && cfg.diloco.outer == config::outer_policy_kind::async) {
    const auto* place = ctx.cluster->place();
    const auto nodes = place ? static_cast<int64_t>(place->names.size()) : 1;
    policy.dn_period = cfg.async.dn_period > 0 ? cfg.async.dn_period : 2 * nodes;
    spdlog::info(
        "async: Delayed Nesterov, each contribution moves theta by 1/{} of itself, momentum every {} "
        "contributions{}",
        policy.dn_period, policy.dn_period,
        cfg.async.dn_period > 0 ? "" : " (async.dn_period = 0: twice the nodes)");
  }
  policy.pinned_theta = ctx.devices.any_cuda();
  return spawn_outer_optimizer(sys, outer_cfg, models::gpt::init_flat(ctx.spec, cfg.run.seed), metrics,
                               std::move(policy));
}

/// One wait of the main loop that timed out: Ctrl-C (a stop with a checkpoint, or at the second one an exit
/// without it), then the cluster tick. In that order, a stop signalled to every role at once (launch) reaches
/// training before the coordinator's call-off that follows it, which would end training without a checkpoint.
void on_idle(caf::scoped_actor& self, const actor_graph& g, cluster_link& cluster, bool* stop_sent) {
  const int n = g_signals.load();
  if (n >= 2) {
    std::string newest = "none";
    std::error_code ec;
    if (const auto lost = g.lock_lost ? g.lock_lost() : std::string(); !lost.empty())
      newest = "unknown: this run no longer holds its directory (" + lost + ")";
    else if (std::filesystem::is_directory(g.ckpt_dir, ec))
      if (const auto files = checkpoint_store(g.ckpt_dir, 1 << 30).list(); !files.empty())
        newest = files.back() + " (a rerun takes the newest valid one)";
    spdlog::warn(
        "second interrupt: exiting at once, without waiting for a checkpoint; newest checkpoint file "
        "on disk: {}",
        newest);
    std::_Exit(130);
  }
  if (g_watch_pipes && !*stop_sent && !g_hangup.load() && output_closed()) {
    spdlog::warn("the reader of this run's output is gone (a closed pipe): stopping as for a hangup");
    g_hangup.store(true);
  }
  if ((n == 1 || g_hangup.load()) && !*stop_sent) {
    spdlog::info(
        "interrupt: finishing the current inner step and saving a checkpoint (Ctrl-C again to abort)");
    self->send(g.coordinator, stop_atom_v);
    // A running cluster all-reduce ends now instead of at its deadline.
    if (g.collective) g.collective->cancel();
    *stop_sent = true;
  }
  if (cluster.place()) {
    node_controls controls;
    controls.leave = [&g] { caf::anon_send(g.coordinator, stop_atom_v, done_atom_v); };
    controls.hold = [&]() -> std::optional<uint64_t> {
      std::optional<uint64_t> round;
      self->request(g.coordinator, std::chrono::seconds(10), hold_atom_v)
          .receive([&](uint64_t r) { round = r; },
                   [&](caf::error& e) {
                     spdlog::warn("holding at a round boundary: training did not answer: {}", describe(e));
                   });
      return round;
    };
    controls.stop_after = [&g](uint64_t round) { caf::anon_send(g.coordinator, stop_atom_v, round); };
    controls.hold_until = [&g](uint64_t round) { caf::anon_send(g.coordinator, hold_atom_v, round); };
    controls.release = [&g] { caf::anon_send(g.coordinator, hold_atom_v, done_atom_v); };
    controls.merge = [&g](merge_order order) {
      caf::anon_send(g.coordinator, merge_atom_v, std::move(order));
    };
    // A stop under way (Ctrl-C) ends with its checkpoint: a call-off that follows it does not cut it short.
    if (!*stop_sent)
      controls.end = [&g](std::string why) {
        caf::anon_send(g.coordinator, lost_atom_v, make_error(errc::evicted, std::move(why)));
      };
    cluster.tick([&g](std::string line) { caf::anon_send(g.peers.metrics, record_atom_v, std::move(line)); },
                 controls);
  }
}

}  // namespace

void configure_system(caf::actor_system_config& sys_cfg) {
  sys_cfg.add_message_types<caf::id_block::longwave>();
  // Compute runs on detached threads (workers, outer optimizer, communicator, evaluator, checkpointer). The
  // scheduled actors (coordinator, metrics) are light: one scheduler thread on a shared queue that sleeps
  // instead of spinning, so it does not steal cycles from LibTorch.
  sys_cfg.set("scheduler.policy", caf::atom("sharing"));
  sys_cfg.set("scheduler.max-threads", 1);
}

void watch_closed_output() {
  static const bool watch =
      std::signal(SIGPIPE, SIG_IGN) != SIG_IGN;  // once: a second call would see SIG_IGN
  g_watch_pipes = watch;
}

actor_graph spawn_graph(caf::actor_system& sys, std::shared_ptr<run_context> ctx, const run_paths& p,
                        const run_options& opts, cluster_link& cluster, start_point start) {
  if (opts.stage_on_cpu) ctx->inner.stage_delta = true;
  ctx->started_fresh = opts.fresh;
  actor_graph g;
  g.ckpt_dir = p.ckpt_dir;
  g.lock_lost = ctx->lock_lost;
  g.peers.metrics = spawn_metrics(sys, ctx->cfg, p, opts, cluster.place(), start.corrupt_checkpoints);
  auto comm_opts = communicator_options_for(ctx->cfg, cluster, g.peers.metrics);
  comm_opts.stage_mean = ctx->mean_on_device();
  g.collective = comm_opts.collective;
  g.peers.communicator =
      opts.communicator_override ? opts.communicator_override(sys) : spawn_communicator(sys, comm_opts);
  g.peers.outer = spawn_outer(sys, *ctx, g.peers.metrics, g.collective);
  g.peers.collective = g.collective;
  g.peers.checkpointer = spawn_checkpointer(sys, p.ckpt_dir, ctx->cfg.checkpoint.keep, shape_of(*ctx),
                                            g.peers.metrics, ctx->lock_lost, start.resumed_from);
  if (ctx->cfg.eval.async) g.peers.evaluator = spawn_evaluator(sys, ctx);
  g.coordinator = spawn_coordinator(sys, ctx, g.peers, std::move(start.resume), p.trace);
  return g;
}

int run_until_done(caf::actor_system& sys, const actor_graph& g, const run_options& opts,
                   cluster_link& cluster) {
  using handler = void (*)(int);
  handler before[3] = {SIG_DFL, SIG_DFL, SIG_DFL};
  const auto& signals = stop_signals;
  if (opts.handle_signals) {
    g_signals = 0;
    g_hangup = false;
    // An ignored signal stays ignored (nohup's SIGHUP, a background job's SIGINT); the others stop the run.
    for (int i = 0; i < 3; ++i) {
      if ((before[i] = std::signal(signals[i], on_signal)) == SIG_IGN) std::signal(signals[i], SIG_IGN);
      if (before[i] == on_setup_signal) before[i] = g_setup_before[i];
    }
    g_setup_active = false;  // these handlers are restored below, not setup_signals
  }
  int code = 1;
  {
    caf::scoped_actor self{sys};
    self->send(g.coordinator, start_atom_v);
    bool running = true, stop_sent = false;
    while (running) {
      self->receive(
          [&](done_atom, int c, double) { code = c, running = false; },
          caf::after(std::chrono::milliseconds(100)) >> [&] { on_idle(self, g, cluster, &stop_sent); });
    }
    using caf::actor_cast;
    for (const auto& a : {actor_cast<caf::actor>(g.coordinator), actor_cast<caf::actor>(g.peers.communicator),
                          actor_cast<caf::actor>(g.peers.outer), actor_cast<caf::actor>(g.peers.checkpointer),
                          actor_cast<caf::actor>(g.peers.evaluator), actor_cast<caf::actor>(g.peers.metrics)})
      if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  if (opts.handle_signals) {
    runtime::keep_exit_code(code);  // ended (stopped, failed or done): a late signal keeps the code said
    for (int i = 0; i < 3; ++i) {
      handler h = before[i] == SIG_ERR ? SIG_DFL : before[i];
      if (h != SIG_IGN && signals[i] != SIGHUP) h = runtime::late_signal();
      std::signal(signals[i], h);
    }
    // The terminal is gone: the hangup it may send again while the process ends must not kill it (129).
    if (g_hangup.load()) std::signal(SIGHUP, SIG_IGN);
  }
  return code;
}

}  // namespace longwave::actors
