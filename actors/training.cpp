// Start-up and shutdown of one run: data, model size, resume, the actor graph and signal handling.
#include "actors/training.hpp"

#include <ATen/ATen.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "actors/checkpointer.hpp"
#include "actors/collective_factory.hpp"
#include "actors/communicator.hpp"
#include "actors/coordinator.hpp"
#include "actors/evaluator.hpp"
#include "actors/metrics_sink.hpp"
#include "actors/outer_optimizer.hpp"
#include "actors/run_context.hpp"
#include "config/config_loader.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/data/shard.hpp"
#include "models/data/window_sampler.hpp"
#include "models/gpt.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/type_ids.hpp"

namespace fs = std::filesystem;

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

std::atomic<int> g_signals{0};

void on_signal(int) {
  g_signals.fetch_add(1);
}

struct paths {
  std::string out_dir, data_dir, ckpt_dir, trace, config_copy;
};

paths resolve_paths(const config::train_config& cfg) {
  paths p;
  p.out_dir = cfg.run.out_dir;
  p.data_dir = cfg.data.cache_dir.empty() ? (fs::path(p.out_dir) / "data").string() : cfg.data.cache_dir;
  p.ckpt_dir =
      cfg.checkpoint.dir.empty() ? (fs::path(p.out_dir) / "checkpoints").string() : cfg.checkpoint.dir;
  p.trace = (fs::path(p.out_dir) / "loss_trace.tsv").string();
  p.config_copy = (fs::path(p.out_dir) / "config.toml").string();
  return p;
}

std::string corpus_path(const config::train_config& cfg) {
  const std::string path = cfg.data.path.empty() ? default_corpus_path() : cfg.data.path;
  if (!fs::exists(path)) {
    if (cfg.data.path.empty())
      throw config::config_error("data.path", "data.path: the default corpus " + path +
                                                  " is missing; run scripts/setup (it writes the KJV text) "
                                                  "or set data.path to a text, JSONL or shard directory");
    throw config::config_error("data.path", "data.path = \"" + path + "\": no such file or directory");
  }
  return path;
}

int64_t expected_vocab(const config::train_config& cfg) {
  if (cfg.model.vocab_size > 0) return cfg.model.vocab_size;
  return cfg.data.tokenizer == config::tokenizer_kind::bpe ? cfg.data.bpe_vocab_size : 256;
}

void print_dry_run(const config::train_config& cfg, const models::model_spec& spec) {
  const int64_t n = models::closed_form_param_count(spec);
  const int64_t mem =
      models::training_memory_bytes(spec, cfg.train.batch_size, cfg.model.dtype == config::model_dtype::bf16);
  std::printf("%s\n", config::to_toml(cfg).c_str());
  std::printf(
      "# model: preset %s, dim %ld, layers %ld, heads %ld (kv %ld), ffn %ld, vocab %ld, context %ld\n",
      spec.preset.c_str(), spec.dim, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.ffn_hidden,
      spec.vocab_size, spec.seq_len);
  std::printf("# parameters: %ld (%.2fM)\n", n, static_cast<double>(n) / 1e6);
  std::printf("# memory estimate: %.1f MiB per worker, %.1f MiB for %ld workers (this machine: %.1f MiB)\n",
              static_cast<double>(mem) / (1 << 20), static_cast<double>(mem * cfg.train.workers) / (1 << 20),
              cfg.train.workers, static_cast<double>(physical_memory_bytes()) / (1 << 20));
  std::printf("# inner steps per worker: %ld (%ld rounds x H=%ld); tokens per worker: %ld\n",
              cfg.train.rounds * cfg.train.inner_steps, cfg.train.rounds, cfg.train.inner_steps,
              cfg.train.rounds * cfg.train.inner_steps * cfg.train.batch_size * cfg.model.seq_len);
}

// Keeps the lines of an earlier trace up to `step` (a resume rewrites the steps after its checkpoint).
void truncate_trace(const std::string& path, uint64_t step) {
  std::ifstream in(path);
  std::ostringstream keep;
  std::string line;
  while (std::getline(in, line)) {
    const auto tab = line.find('\t');
    if (tab == std::string::npos) continue;
    if (std::strtoull(line.substr(0, tab).c_str(), nullptr, 10) <= step) keep << line << '\n';
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << keep.str();
}

/// Says what the checkpoint directory holds besides checkpoints, and removes unfinished writes (a process
/// that died mid-write leaves a .tmp, which the lock shows is nobody's now). Returns whether there was any.
bool report_stray_files(const checkpoint_store& store) {
  const auto strays = store.stray_files();
  for (const auto& f : strays) {
    std::error_code ec;
    if (f.unfinished_write && fs::remove(f.path, ec))
      spdlog::warn("checkpoint: removed {}: {}", f.path, f.reason);
    else
      spdlog::warn("checkpoint: ignoring {}: {}", f.path, f.reason);
  }
  return !strays.empty();
}

/// A boundary checkpoint at or past train.rounds: the run is done (a mid-round one has rounds left).
bool run_complete(const train_snapshot& snap, const config::train_config& cfg) {
  if (snap.round < static_cast<uint64_t>(cfg.train.rounds)) return false;
  for (const auto& r : snap.replicas)
    if (r.steps_in_round != 0) return false;
  return true;
}

std::shared_ptr<const std::vector<uint16_t>> load_tokens(const std::string& path) {
  return std::make_shared<const std::vector<uint16_t>>(models::data::read_shard(path));
}

/// The newest valid checkpoint of at most `max_round` completed rounds (a cluster's agreed round). Newer ones
/// stay on disk (training is deterministic: the resumed run writes the same states again).
std::optional<checkpoint> load_at_most(const checkpoint_store& store, uint64_t max_round, int* skipped) {
  const auto files = store.list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      auto c = checkpoint_store::load_file(*it);
      if (c.round > max_round) continue;
      spdlog::info("resuming from {} (the cluster resumes after round {})", *it, max_round);
      return c;
    } catch (const lw_error& e) {
      spdlog::warn("checkpoint {} skipped: {}", *it, e.what());
      ++*skipped;
    }
  }
  if (max_round > 0)
    throw lw_error(
        errc::corrupt_checkpoint,
        fmt::format("the cluster resumes after round {}, but {} holds no valid checkpoint at or before "
                    "it; restore one, or start every node with --fresh",
                    max_round, store.dir()));
  if (!files.empty())
    throw lw_error(
        errc::invalid_config,
        fmt::format("this node has checkpoints in {} but another node has none, so the cluster would "
                    "start over; start every node with --fresh, or restore the other nodes' checkpoints",
                    store.dir()));
  return std::nullopt;
}

/// Logs rejected frames (the first 50, then every 1000th) and counts them by reason.
comm::ring_allreduce::reject_callback rejection_logger(caf::actor metrics) {
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

bool is_streaming(const config::train_config& cfg) {
  return cfg.run.mode == config::run_mode::diloco && cfg.diloco.outer == config::outer_policy_kind::streaming;
}

/// The model shape of a config, checked against what the config asks of it (before any file is touched).
models::model_spec model_spec_of(const config::train_config& cfg) {
  auto spec = models::preset_spec(cfg.model.preset, expected_vocab(cfg), cfg.model.seq_len);
  if (is_streaming(cfg) && cfg.diloco.fragments > spec.n_layers)
    throw config::config_error(
        "diloco.fragments", fmt::format("diloco.fragments = {}: model '{}' has only {} layers to split into "
                                        "fragments",
                                        cfg.diloco.fragments, spec.preset, spec.n_layers));
  check_memory_fits(cfg, spec);
  return spec;
}

/// Everything the actors share: the data (prepared or reused), the final model shape, threads, this node's
/// place in the cluster, streaming's fragments. Checks the data against the sampling plan, so a bad corpus
/// is a clear error before any actor starts.
std::shared_ptr<run_context> make_context(const config::train_config& cfg, models::model_spec spec,
                                          const std::string& corpus, const paths& p,
                                          const cluster_role* role) {
  auto data = models::data::prepare_dataset(corpus, cfg.data.tokenizer, cfg.data.bpe_vocab_size,
                                            cfg.data.val_fraction, p.data_dir,
                                            [](const std::string& line) { spdlog::info("{}", line); });
  if (cfg.model.vocab_size > 0 && cfg.model.vocab_size < data.vocab_size)
    throw config::config_error("model.vocab_size",
                               "model.vocab_size = " + std::to_string(cfg.model.vocab_size) +
                                   ": the data has token ids up to " + std::to_string(data.vocab_size - 1));
  spec.vocab_size = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : data.vocab_size;

  auto ctx = std::make_shared<run_context>();
  ctx->cfg = cfg;
  ctx->spec = spec;
  ctx->inner = make_inner_options(cfg);
  ctx->config_toml = config::to_toml(cfg);
  ctx->train_tokens = load_tokens(data.train_path);
  ctx->val_tokens = load_tokens(data.val_path);
  const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  ctx->threads_per_worker =
      cfg.train.threads > 0 ? cfg.train.threads : std::max<int64_t>(1, hw / cfg.train.workers);
  if (role) {
    ctx->rank_offset = role->rank_offset;
    ctx->cluster_workers = role->cluster_workers;
  }
  if (is_streaming(cfg))
    ctx->fragments = models::fragment_ranges(spec, cfg.diloco.fragments,
                                             cfg.diloco.fragment_pattern == config::fragment_layout::strided);
  models::data::window_sampler probe(ctx->train_tokens, ctx->global_workers() - 1, ctx->global_workers(),
                                     cfg.train.batch_size, spec.seq_len, cfg.run.seed);
  (void)models::data::validation_batch(*ctx->val_tokens, 0, cfg.train.batch_size, spec.seq_len);
  spdlog::info("data: {} train tokens, {} val tokens, vocab {}", ctx->train_tokens->size(),
               ctx->val_tokens->size(), spec.vocab_size);
  return ctx;
}

snapshot_shape shape_of(const run_context& ctx) {
  return {models::closed_form_param_count(ctx.spec), ctx.cfg.train.workers,
          config::to_string(ctx.cfg.run.mode), ctx.spec.preset};
}

/// Where the run starts: a snapshot to resume (none: from scratch), or nothing to do.
struct start_point {
  std::optional<train_snapshot> resume;
  bool complete = false;        ///< the checkpoint already holds train.rounds rounds
  int corrupt_checkpoints = 0;  ///< skipped files, counted in longwave_errors_total once metrics run
};

/// --fresh removes the checkpoints and the trace; otherwise the newest valid checkpoint (a cluster node: at
/// most the agreed round) is the start. Strays in the checkpoint directory are named first.
start_point find_start(const config::train_config& cfg, const run_options& opts, const paths& p,
                       const snapshot_shape& shape) {
  start_point start;
  const bool strays = report_stray_files(checkpoint_store(p.ckpt_dir, cfg.checkpoint.keep));
  if (opts.fresh) {
    std::error_code ec;
    for (const auto& f : checkpoint_store(p.ckpt_dir, cfg.checkpoint.keep).list()) fs::remove(f, ec);
    fs::remove(p.trace, ec);
    return start;
  }
  checkpoint_store store(p.ckpt_dir, cfg.checkpoint.keep);
  auto latest = opts.max_resume_round
                    ? load_at_most(store, *opts.max_resume_round, &start.corrupt_checkpoints)
                    : store.load_latest([&](const std::string& w) {
                        spdlog::warn("{}", w);
                        ++start.corrupt_checkpoints;
                      });
  if (latest) start.resume = from_checkpoint(std::move(*latest), shape);
  if (!latest && strays) spdlog::info("no checkpoint to resume from in {}: starting a fresh run", p.ckpt_dir);
  if (!start.resume || !run_complete(*start.resume, cfg)) return start;
  start.complete = true;
  spdlog::info(
      "run complete: {} already holds round {} of train.rounds = {} (inner step {}); nothing to train. "
      "Raise train.rounds to train more rounds, or pass --fresh to start over",
      p.out_dir, start.resume->round, cfg.train.rounds, start.resume->step);
  if (!fs::exists(fs::path(p.out_dir) / "result.json"))
    spdlog::warn(
        "{} has no result.json (the run ended before writing it); `longwave eval {}` gives the final "
        "validation loss",
        p.out_dir, p.ckpt_dir);
  return start;
}

/// The loss trace cut back to the resumed step (or emptied), and the resolved config beside it.
void reset_run_files(const config::train_config& cfg, const paths& p, const start_point& start) {
  if (start.resume)
    truncate_trace(p.trace, start.resume->step);
  else
    std::ofstream(p.trace, std::ios::trunc);
  std::ofstream out(p.config_copy, std::ios::trunc);
  out << config::to_toml(cfg);
}

void configure_system(caf::actor_system_config& sys_cfg) {
  sys_cfg.add_message_types<caf::id_block::longwave>();
  // Compute runs on the workers' own (detached) threads. The scheduled actors (coordinator, outer optimizer,
  // metrics) are light: one scheduler thread on a shared queue that sleeps instead of spinning, so it does
  // not steal cycles from LibTorch.
  sys_cfg.set("scheduler.policy", caf::atom("sharing"));
  sys_cfg.set("scheduler.max-threads", 1);
}

/// The metrics sink: /metrics (if enabled) and metrics.jsonl, with every worker and peer series made.
caf::actor spawn_metrics(caf::actor_system& sys, const config::train_config& cfg, const paths& p,
                         const run_options& opts, const cluster_role* role, int corrupt_checkpoints) {
  metrics_sink_options o;
  o.port = cfg.metrics.enabled ? static_cast<int>(cfg.metrics.port) : -1;
  o.address = cfg.metrics.address;
  o.node = role ? role->names[static_cast<size_t>(role->rank)]
                : (cfg.run.name.empty() ? std::string("local") : cfg.run.name);
  for (int64_t w = 0; w < cfg.train.workers; ++w) o.workers.push_back(std::to_string(w));
  if (role)
    for (size_t i = 0; i < role->names.size(); ++i)
      if (static_cast<int>(i) != role->rank) o.peers.push_back(role->names[i]);
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
                 static_cast<double>(role ? role->names.size() : 1));
  return metrics;
}

/// The communicator's options: the local mean alone, or (a cluster node) comm.backend across nodes.
communicator_options communicator_options_for(const config::train_config& cfg, const cluster_role* role,
                                              const caf::actor& metrics) {
  communicator_options o;
  o.metrics = metrics;
  o.log_events = cfg.run.mode != config::run_mode::ddp;
  if (!role) return o;
  o.collective = make_collective(cfg, *role, rejection_logger(metrics));
  o.dtype = role->ring.dtype;
  o.codec = role->ring.codec;
  o.error_feedback = cfg.comm.error_feedback;
  const auto world = role->names.size();
  o.next_peer = role->names[(static_cast<size_t>(role->rank) + 1) % world];
  o.prev_peer = role->names[(static_cast<size_t>(role->rank) + world - 1) % world];
  spdlog::info("{}: rank {} of {}, listening on {}, sending to {} ({} on the wire{})", cfg.comm.backend,
               role->rank, world, role->endpoints[static_cast<size_t>(role->rank)], o.next_peer,
               cfg.comm.dtype, cfg.comm.error_feedback ? ", error feedback" : "");
  return o;
}

/// The outer optimizer: theta_0, [outer], and the policy's extra state (streaming's fragments, eager's
/// per-worker replicas). single: theta_global just follows the one worker (theta - 1.0 * (theta -
/// theta_local)); [outer] is unused.
caf::actor spawn_outer(caf::actor_system& sys, const run_context& ctx, const caf::actor& metrics) {
  const auto& cfg = ctx.cfg;
  config::outer_section outer_cfg = cfg.outer;
  if (cfg.run.mode == config::run_mode::single) outer_cfg = config::outer_section{1.0, 0.0, false};
  outer_policy policy;
  policy.fragments = ctx.fragments;
  if (cfg.run.mode == config::run_mode::diloco && cfg.diloco.outer == config::outer_policy_kind::eager) {
    policy.eager_replicas = cfg.train.workers;
    policy.global_workers = ctx.global_workers();
  }
  return spawn_outer_optimizer(sys, outer_cfg, models::gpt::init_flat(ctx.spec, cfg.run.seed), metrics,
                               std::move(policy));
}

/// The running actors of one process, and the collective the main loop may cancel.
struct actor_graph {
  caf::actor coordinator;
  coordinator_peers peers;
  std::shared_ptr<comm::collective> collective;
};

actor_graph spawn_graph(caf::actor_system& sys, std::shared_ptr<run_context> ctx, const paths& p,
                        const run_options& opts, const cluster_role* role, start_point start) {
  actor_graph g;
  g.peers.metrics = spawn_metrics(sys, ctx->cfg, p, opts, role, start.corrupt_checkpoints);
  auto comm_opts = communicator_options_for(ctx->cfg, role, g.peers.metrics);
  g.collective = comm_opts.collective;
  g.peers.communicator =
      opts.communicator_override ? opts.communicator_override(sys) : spawn_communicator(sys, comm_opts);
  g.peers.outer = spawn_outer(sys, *ctx, g.peers.metrics);
  g.peers.checkpointer =
      spawn_checkpointer(sys, p.ckpt_dir, ctx->cfg.checkpoint.keep, shape_of(*ctx), g.peers.metrics);
  if (ctx->cfg.eval.async) g.peers.evaluator = spawn_evaluator(sys, ctx);
  g.coordinator = spawn_coordinator(sys, ctx, g.peers, std::move(start.resume), p.trace);
  return g;
}

/// Starts the coordinator and waits for its (done, code): heartbeats every 100 ms in a cluster, the first
/// Ctrl-C stops with a checkpoint, the second exits at once. Then every actor is told to quit.
int run_until_done(caf::actor_system& sys, const actor_graph& g, const run_options& opts,
                   const cluster_role* role) {
  if (opts.handle_signals) {
    g_signals = 0;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
  }
  int code = 1;
  {
    caf::scoped_actor self{sys};
    self->send(g.coordinator, start_atom_v);
    bool running = true, stop_sent = false;
    while (running) {
      self->receive([&](done_atom, int c, double) { code = c, running = false; },
                    caf::after(std::chrono::milliseconds(100)) >>
                        [&] {
                          if (role && role->tick && g.collective) role->tick(*g.collective);
                          const int n = g_signals.load();
                          if (n >= 2) {
                            spdlog::warn("second interrupt: exiting without waiting for the checkpoint");
                            std::_Exit(130);
                          }
                          if (n == 1 && !stop_sent) {
                            spdlog::info(
                                "interrupt: finishing the current inner step and saving a checkpoint (Ctrl-C "
                                "again to abort)");
                            self->send(g.coordinator, stop_atom_v);
                            // A running cluster all-reduce ends now instead of at its deadline.
                            if (g.collective) g.collective->cancel();
                            stop_sent = true;
                          }
                        });
    }
    for (const auto& a : {g.coordinator, g.peers.communicator, g.peers.outer, g.peers.checkpointer,
                          g.peers.evaluator, g.peers.metrics})
      if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  if (opts.handle_signals) {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  }
  return code;
}

/// One run, top to bottom: check the config, lock the out_dir, prepare the data, find where to start, start
/// the actors, wait for them.
int train(const config::train_config& cfg, const run_options& opts, const cluster_role* role) {
  const auto p = resolve_paths(cfg);
  const std::string corpus = corpus_path(cfg);
  const auto spec = model_spec_of(cfg);
  check_backend(cfg, role);
  if (opts.dry_run) {
    print_dry_run(cfg, spec);
    return 0;
  }
  fs::create_directories(p.out_dir);
  const run_lock lock(p.out_dir);  // one run per out_dir, until this process ends
  spdlog::info("longwave: {} mode, {} workers, preset {} ({:.2f}M parameters, {}), out_dir {}", cfg.run.mode,
               cfg.train.workers, spec.preset,
               static_cast<double>(models::closed_form_param_count(spec)) / 1e6, cfg.model.dtype, p.out_dir);
  auto ctx = make_context(cfg, spec, corpus, p, role);
  auto start = find_start(cfg, opts, p, shape_of(*ctx));
  if (start.complete) return 0;
  reset_run_files(cfg, p, start);
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg);
  caf::actor_system sys{sys_cfg};
  const auto graph = spawn_graph(sys, ctx, p, opts, role, std::move(start));
  return run_until_done(sys, graph, opts, role);
}

}  // namespace

std::string default_corpus_path() {
  if (const char* env = std::getenv("LONGWAVE_CORPUS"); env && *env) return env;
  fs::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    base = fs::path(home) / ".cache";
  else
    base = "/tmp";
  return (base / "longwave" / "kjv.txt").string();
}

uint64_t latest_checkpoint_round(const config::train_config& cfg) {
  checkpoint_store store(resolve_paths(cfg).ckpt_dir, cfg.checkpoint.keep);
  const auto files = store.list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      return checkpoint_store::load_file(*it).round;
    } catch (const lw_error&) {
      // corrupt: the next older one
    }
  }
  return 0;
}

comm::ring_options ring_options_from(const config::train_config& cfg, uint64_t cluster_id) {
  comm::ring_options r;
  r.dtype = cfg.comm.dtype;
  r.codec.int8_codebook = cfg.comm.int8_codebook;
  r.chunk_bytes = static_cast<size_t>(cfg.comm.chunk_kib) * 1024;
  r.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm.timeout_s * 1000));
  r.cluster_id = cluster_id;
  return r;
}

int run_training(const config::train_config& cfg, const run_options& opts, const cluster_role* role) {
  try {
    return train(cfg, opts, role);
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const run_lock_busy& e) {
    spdlog::error("{}", e.what());
    return 4;
  } catch (const lw_error& e) {
    spdlog::error("{}: {}", to_string(e.code()), e.what());
    // corrupt_data: the user's corpus or shards (data.path) are unusable, bad input as much as a bad key.
    return e.code() == errc::invalid_config || e.code() == errc::corrupt_data ? 2 : 1;
  } catch (const c10::Error& e) {
    spdlog::error("torch: {}", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", describe(e));
    return 1;
  }
}

int run_eval(const std::string& checkpoint_path, int64_t batches) {
  try {
    std::optional<checkpoint> c;
    if (fs::is_directory(checkpoint_path)) {
      checkpoint_store store(checkpoint_path, 1 << 30);
      c = store.load_latest([](const std::string& w) { spdlog::warn("{}", w); });
      if (!c) throw lw_error(errc::io_error, checkpoint_path + ": no checkpoint in this directory");
    } else {
      c = checkpoint_store::load_file(checkpoint_path);
    }
    const auto pos = c->meta.find(config_marker);
    if (pos == std::string::npos)
      throw lw_error(errc::corrupt_checkpoint, checkpoint_path + ": no config in meta");
    auto cfg = config::parse_config(c->meta.substr(pos + std::strlen(config_marker)), {}, checkpoint_path);
    const auto p = resolve_paths(cfg);
    auto data = models::data::prepare_dataset(corpus_path(cfg), cfg.data.tokenizer, cfg.data.bpe_vocab_size,
                                              cfg.data.val_fraction, p.data_dir,
                                              [](const std::string& line) { spdlog::info("{}", line); });
    auto spec = models::preset_spec(cfg.model.preset,
                                    cfg.model.vocab_size > 0 ? cfg.model.vocab_size : data.vocab_size,
                                    cfg.model.seq_len);
    snapshot_shape shape{models::closed_form_param_count(spec), cfg.train.workers,
                         config::to_string(cfg.run.mode), spec.preset};
    auto snap = from_checkpoint(std::move(*c), shape);
    auto val = models::data::read_shard(data.val_path);
    models::gpt model(spec, cfg.model.dtype == config::model_dtype::bf16 ? at::kBFloat16 : at::kFloat);
    model.load_flat(snap.theta);
    const int64_t n = batches > 0 ? batches : cfg.eval.batches;
    const double loss = models::validation_loss(model, val, cfg.train.batch_size, n);
    std::printf("checkpoint round %lu, inner step %lu: val loss %.4f, val perplexity %.3f (%ld batches)\n",
                snap.round, snap.step, loss, std::exp(loss), n);
    return 0;
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const lw_error& e) {
    spdlog::error("{}: {}", to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}

}  // namespace longwave::actors
