// One run, top to bottom (train()), its exit codes, and `longwave eval`.
#include "actors/training.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "actors/actor_graph.hpp"
#include "actors/collective_factory.hpp"
#include "actors/evaluator.hpp"
#include "actors/metrics_sink.hpp"
#include "actors/run_files.hpp"
#include "actors/run_setup.hpp"
#include "config/config_loader.hpp"
#include "models/cpu_kernels.hpp"
#include "models/data/data_fingerprint.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/data/shard.hpp"
#include "models/data/tokenizer.hpp"
#include "models/data/window_sampler.hpp"
#include "models/gpt.hpp"
#include "models/gpu_info.hpp"
#include "models/inner_trainer.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics_server.hpp"

namespace fs = std::filesystem;

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

/// The run's lock on `dir`, the first file it makes there: a directory where none can be made (no
/// permission, read-only, /sys) is a config error naming the key that chose it.
void take_lock(std::optional<run_lock>& lock, const std::string& key, const std::string& dir) {
  try {
    lock.emplace(dir, key);
  } catch (const run_lock_unwritable& e) {
    throw config::config_error(key, key + " = \"" + dir + "\": no file can be made there (" + e.what() + ")");
  }
}

/// A finished run whose result.json does not describe its newest checkpoint (killed during its final
/// evaluation, after a resume that trained more rounds): that evaluation is made now, as the run makes it,
/// and result.json and metrics.jsonl's eval and end records written; a sweep reads its point's final loss
/// from them. Else nothing: the run was complete. Returns the exit code.
int finish_complete_run(const run_context& ctx, const run_paths& p, const train_snapshot& snap) {
  const auto& cfg = ctx.cfg;
  if (cfg.diloco.outer == config::outer_policy_kind::async || result_describes(p.out_dir, snap)) return 0;
  spdlog::info("{} has no result.json of round {}: its final evaluation ({} batches) runs now", p.out_dir,
               snap.round, cfg.eval.batches);
  const auto t0 = std::chrono::steady_clock::now();
  // The evaluator's one thread (eval.async), else worker 0's.
  at::set_num_threads(static_cast<int>(cfg.eval.async ? 1 : ctx.threads_per_worker));
  const double loss = evaluate_theta(ctx, snap.theta, cfg.eval.batches);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("final: val loss {:.4f} | val perplexity {} | {} rounds x {} inner steps x {} workers", loss,
               readable(std::exp(loss), 3), snap.round, cfg.train.inner_steps, cfg.train.workers);
  const int64_t batch_tokens = cfg.train.batch_size * ctx.spec.seq_len;
  int64_t tokens = 0;
  for (const auto& r : snap.replicas) tokens += static_cast<int64_t>(r.sampler_position) * batch_tokens;
  const auto step = static_cast<int64_t>(snap.step);
  // result.json first: a kill before it makes the next start evaluate again, with no records twice.
  if (const auto why = write_result_file(cfg, run_result{snap.round, step, loss, tokens, secs, 0});
      !why.empty()) {
    spdlog::error("the run's final evaluation is done, but result.json could not be written: {}", why);
    return 1;
  }
  // A session of its own (its start record): the report's training time leaves out the wait before it.
  if (auto log = open_event_log((fs::path(p.out_dir) / "metrics.jsonl").string())) {
    log << start_record(ctx, step, snap.round).str() << '\n'
        << eval_record(snap.round, step, loss).str() << '\n'
        << end_record(0, loss, secs, step, snap.round).str() << '\n'
        << std::flush;
  }
  return 0;
}

/// One run, top to bottom: check the config, lock the out_dir, prepare the data, find where to start, start
/// the actors, wait for them.
int train(const config::train_config& cfg, const run_options& opts, cluster_link& cluster) {
  if (opts.handle_signals) watch_closed_output();
  setup_signals setup(opts.handle_signals);
  const auto p = resolve_paths(cfg);
  const std::string corpus = corpus_path(cfg);
  const auto spec = model_spec_of(cfg, corpus);
  check_backend(cfg);
  if (cfg.diloco.outer == config::outer_policy_kind::async && !cluster.place() && !opts.cluster_node)
    throw config::config_error("diloco.outer",
                               "diloco.outer = \"async\" merges the pseudo-gradients of a cluster's nodes as "
                               "they arrive; one process alone has none to wait for: run it as a node of a "
                               "cluster (longwave node), or use diloco.outer = \"sync\"");
  const auto devices = plan_devices(cfg, spec);
  if (opts.dry_run) {
    print_dry_run(cfg, spec, devices);
    return 0;
  }
  make_run_directory("run.out_dir", p.out_dir);
  std::optional<run_lock> lock;  // one run per out_dir, until this process ends
  take_lock(lock, "run.out_dir", p.out_dir);
  check_run_files(p);
  // And per checkpoint directory: two runs sharing one would resume from, rotate away and overwrite each
  // other's checkpoints.
  make_run_directory("checkpoint.dir", p.ckpt_dir);
  std::optional<run_lock> ckpt_lock;
  if (!fs::equivalent(p.ckpt_dir, p.out_dir)) take_lock(ckpt_lock, "checkpoint.dir", p.ckpt_dir);
  // A metrics port another process holds fails now, not after the data is prepared (a cluster node checked
  // its ports before its hello).
  if (cfg.metrics.enabled && !opts.cluster_node)
    runtime::check_metrics_port_free(cfg.metrics.address, static_cast<int>(cfg.metrics.port));
  make_data_directory(cfg, corpus, p.data_dir);
  spdlog::info("longwave: {} mode, {} workers, model {} ({:.2f}M parameters, {}), out_dir {}", cfg.run.mode,
               cfg.train.workers, models::model_label(spec),
               static_cast<double>(models::closed_form_param_count(spec)) / 1e6, cfg.model.dtype, p.out_dir);
  spdlog::info("cpu: {}", models::cpu_kernels());
  if (devices.any_cuda()) spdlog::info("gpu: workers on {}; {}", devices.describe(), models::gpu_summary());
  auto ctx = make_context(cfg, spec, corpus, p.data_dir, devices, cluster);
  ctx->lock_lost = [&lock, &ckpt_lock] {
    if (auto why = lock->lost(); !why.empty()) return why;
    return ckpt_lock ? ckpt_lock->lost() : std::string();
  };
  start_point start;
  if (cluster.joining()) {
    // Joining a running cluster: fetch the members' state and wait to be admitted (completes the place).
    const own_checkpoint own = opts.fresh ? own_checkpoint{} : newest_checkpoint(cfg);
    start = joined_start(cfg, opts, p, shape_of(*ctx), cluster.join(shape_of(*ctx), own), own);
    ctx->observe_round = cluster.place()->observe_round;
    ctx->recovery = cluster.place()->recovery;
  } else {
    start = find_start(cfg, opts, p, shape_of(*ctx));
  }
  if (start.complete) return finish_complete_run(*ctx, p, *start.resume);
  if (start.resume) plan_resumed_run(*ctx, *start.resume);
  auto paths = p;
  if (!reset_run_files(cfg, p, start, opts.config_file)) paths.trace.clear();  // no trace this session
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg);
  caf::actor_system sys{sys_cfg};
  const auto graph = spawn_graph(sys, ctx, paths, opts, cluster, std::move(start));
  return run_until_done(sys, graph, opts, cluster);
}

}  // namespace

std::vector<runtime::held_round> held_checkpoints(const config::train_config& cfg) {
  return checkpoint_store(resolve_paths(cfg).ckpt_dir, cfg.checkpoint.keep)
      .held_rounds([](const std::string& line) { spdlog::warn("{}", line); });
}

namespace {

/// The newest checkpoint file of cfg's run that loads, if any. `set_aside` (only under the run's lock): the
/// corrupt ones it passes are moved to corrupt/, unless none loads.
std::optional<checkpoint> newest_valid(const config::train_config& cfg, bool set_aside) {
  const checkpoint_store store(resolve_paths(cfg).ckpt_dir, cfg.checkpoint.keep);
  std::vector<std::string> corrupt;
  try {
    auto c = store.load_latest({}, {}, &corrupt);
    if (set_aside) set_aside_corrupt(store, corrupt);
    return c;
  } catch (const lw_error& e) {
    if (e.code() != errc::corrupt_checkpoint) throw;  // none loads: left as they are
  }
  return std::nullopt;
}

}  // namespace

own_checkpoint newest_checkpoint(const config::train_config& cfg) {
  const auto c = newest_valid(cfg, /*set_aside=*/true);
  if (!c) return {};
  own_checkpoint own{c->round, c->theta_crc(), c->step, {}};
  for (int64_t r = 0;; ++r) {
    const auto v = counters_of(*c, r);
    if (!v) break;
    const bool fits =
        v->sampler_position >= 0 && v->sampler_position <= max_replica_count;  // as from_checkpoint
    own.sampler_positions.push_back(fits ? static_cast<uint64_t>(v->sampler_position) : 0);
  }
  return own;
}

uint64_t latest_checkpoint_version(const config::train_config& cfg) {
  const auto c = newest_valid(cfg, /*set_aside=*/false);  // before the hello: the run's lock is not taken yet
  return c ? std::strtoull(parse_meta(c->meta)["version"].c_str(), nullptr, 10) : 0;
}

comm::sparse_options sparse_options_from(const config::train_config& cfg) {
  comm::sparse_options o;
  o.chunk = static_cast<size_t>(cfg.comm.sparse_chunk);
  o.density = cfg.comm.density;
  o.value_bits = static_cast<unsigned>(cfg.comm.value_bits);
  return o;
}

comm::reduction_options reduction_options_from(const config::train_config& cfg) {
  comm::reduction_options o;
  o.dtype = cfg.comm.dtype;
  o.codec.int8_codebook = cfg.comm.int8_codebook;
  o.error_feedback = cfg.comm.error_feedback;
  o.sparse = sparse_options_from(cfg);
  o.ef_decay = static_cast<float>(cfg.comm.ef_decay);
  o.robust_clip = cfg.comm.robust_clip;
  o.shared_indices = cfg.comm.sparse_indices == config::sparse_index_mode::shared;
  o.mask_seed = cfg.run.seed;
  return o;
}

namespace {
/// Seconds as whole milliseconds, rounded up: a positive timeout under a millisecond is one (it was 0, which
/// the ring refused from inside an actor, or read as "never" for a link).
std::chrono::milliseconds ms_up(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000)));
}
}  // namespace

comm::ring_options ring_options_from(const config::train_config& cfg, uint64_t cluster_id) {
  comm::ring_options r;
  r.dtype = comm::dense_dtype(cfg.comm.dtype);
  r.codec.int8_codebook = cfg.comm.int8_codebook;
  r.chunk_bytes = static_cast<size_t>(cfg.comm.chunk_kib) * 1024;
  r.timeout = ms_up(cfg.comm.timeout_s);
  r.link_timeout = ms_up(cfg.comm.link_timeout_s);
  r.cluster_id = cluster_id;
  return r;
}

int run_training(const config::train_config& cfg, const run_options& opts, cluster_link& cluster) {
  try {
    return train(cfg, opts, cluster);
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const run_lock_busy& e) {
    spdlog::error("{}", e.what());
    return 4;
  } catch (const lw_error& e) {
    if (e.code() == errc::cancelled) {  // e.g. a joiner turned away because its cluster stops
      spdlog::info("{}", e.what());
      return 130;
    }
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

namespace {

/// The evaluated tokens must be the model's: shards that carry their tokenizer (--data DIR) of its size when
/// the run took its vocabulary from the data (a run on ready shards read their tokenizer.txt, whatever
/// data.tokenizer said), and no token id past the model's vocabulary.
void check_eval_tokens(const config::train_config& cfg, const models::model_spec& spec,
                       const models::data::prepared_dataset& data, const std::string& key,
                       const std::string& corpus, const std::string& trained_with) {
  const auto advice = fmt::format("name the run's corpus, or its shards ({})", resolve_paths(cfg).data_dir);
  if (!data.tokenizer_path.empty()) {
    const auto tok = models::data::load_tokenizer(data.tokenizer_path);
    if (cfg.model.vocab_size == 0 && tok->vocab_size() != spec.vocab_size)
      throw config::config_error(
          key, fmt::format("{} {}: its shards are tokenized by a {} tokenizer of {} tokens ({}), the "
                           "checkpoint's model has {}: the loss would be over other tokens; {}",
                           key, corpus, tok->kind(), tok->vocab_size(), data.tokenizer_path, spec.vocab_size,
                           advice));
    // The checkpoint names the tokenizer it was trained with (older ones do not): another one's ids stand
    // for other text (a corpus edited since, whose BPE was trained again).
    if (const auto now = models::data::tokenizer_label(*tok); !trained_with.empty() && now != trained_with)
      throw config::config_error(
          key,
          fmt::format("{} {}: its tokenizer ({}, {}) is not the one the checkpoint was trained with ({}): "
                      "the loss would be over other tokens; {}",
                      key, corpus, now, data.tokenizer_path, trained_with, advice));
  } else if (cfg.data.tokenizer != config::tokenizer_kind::byte ||
             (!trained_with.empty() && trained_with.rfind("byte ", 0) != 0)) {
    spdlog::warn(
        "eval: {} {} has no tokenizer.txt: its token ids are taken as the run's {} tokens, unchecked", key,
        corpus,
        trained_with.empty() ? config::to_string(cfg.data.tokenizer)
                             : trained_with.substr(0, trained_with.find(' ')));
  }
  if (data.vocab_size > spec.vocab_size)
    throw config::config_error(key, fmt::format("{} {}: its token ids run up to {}, past the checkpoint's "
                                                "model's vocabulary of {} tokens; {}",
                                                key, corpus, data.vocab_size - 1, spec.vocab_size, advice));
}

}  // namespace

int run_eval(const std::string& checkpoint_path, int64_t batches, const std::string& data_override) {
  bool loading = true;  // what fails while the named checkpoint is read is bad input, as for export
  try {
    auto [c, cfg] = load_named_checkpoint(checkpoint_path);
    const auto spec = checkpoint_spec(
        cfg, static_cast<int64_t>(theta_blob(c, checkpoint_path).size / sizeof(float)), checkpoint_path);
    loading = false;
    const auto p = resolve_paths(cfg);
    std::string corpus;
    if (data_override.empty()) {
      try {
        corpus = corpus_path(cfg);
      } catch (const config::config_error& e) {  // the stored path is where the run was, not here
        throw config::config_error(e.key(), e.message() +
                                                " (the checkpoint's stored config; name the corpus "
                                                "here with --data)");
      }
    } else {
      std::error_code ec;
      if (const auto bad = config::one_line_problem(data_override); !bad.empty())
        throw config::config_error("--data", "--data: " + bad);
      if (!fs::exists(data_override, ec))
        throw config::config_error("--data", "--data " + data_override + ": no such file or directory");
      if (const auto why = not_a_corpus(data_override); !why.empty())
        throw config::config_error("--data", "--data " + data_override + ": " + why);
      corpus = data_override;
    }
    // The corpus named, or the run's own edited in place since: the loss is over other text. The run's own
    // prepared shards (--data RUN/data) match by the corpus their stamp names.
    const auto meta = parse_meta(c.meta);
    const auto read_by_run = [&](const std::string& fingerprint) {
      if (fingerprint == std::to_string(models::data::data_fingerprint(corpus))) return true;
      std::error_code ec;
      const auto from = fs::is_directory(corpus, ec) ? models::data::prepared_from(corpus) : std::string();
      return !from.empty() && fingerprint == std::to_string(models::data::data_fingerprint(from));
    };
    const auto trained_with = meta.find("tokenizer");
    const std::string key = data_override.empty() ? "data.path" : "--data";
    std::error_code ec;
    const auto* own_tokenizer = c.find("tokenizer");
    std::vector<uint16_t> val;
    std::string val_from;
    if (const auto it = meta.find("data"); it != meta.end() && !read_by_run(it->second)) {
      const auto what = data_override.empty() ? "the corpus " + corpus : "--data " + corpus;
      const auto differs =
          fmt::format("its fingerprint differs{}", data_override.empty() ? ": it changed since" : "");
      // Other text: tokenized with the checkpoint's own tokenizer, the only one whose ids are the model's
      // (a BPE trained on that text would not be).
      if (own_tokenizer && own_tokenizer->size > 0 && !fs::is_directory(corpus, ec)) {
        const auto tok = models::data::parse_tokenizer(
            std::string(static_cast<const char*>(own_tokenizer->data), own_tokenizer->size),
            "the checkpoint's tokenizer");
        spdlog::warn(
            "eval: {} is not the data the checkpoint's run read ({}): the loss is over its last {:g} % (the "
            "run's data.val_fraction), tokenized with the checkpoint's tokenizer ({})",
            what, differs, 100 * cfg.data.val_fraction, models::data::tokenizer_label(*tok));
        val = models::data::validation_tokens(corpus, *tok, cfg.data.val_fraction,
                                              [](const std::string& line) { spdlog::info("{}", line); });
        val_from = corpus;
        if (static_cast<int64_t>(val.size()) < spec.seq_len + 2)
          throw config::config_error(
              key, fmt::format("{} {}: its last {:g} % is {} token{}, fewer than one validation window of "
                               "this model (seq_len + 2 = {}): name a longer text",
                               key, corpus, 100 * cfg.data.val_fraction, val.size(),
                               val.size() == 1 ? "" : "s", spec.seq_len + 2));
      } else {
        // Shards, or a checkpoint of an older build (it carries no tokenizer): the data's own is taken.
        spdlog::warn(
            "eval: {} is not the data the checkpoint's run read ({}): the loss is over another "
            "validation set{}",
            what, differs,
            cfg.data.tokenizer == config::tokenizer_kind::bpe && !fs::is_directory(corpus, ec)
                ? ", with a BPE tokenizer trained anew"
                : "");
      }
    }
    if (val_from.empty()) {
      const auto data = find_or_prepare_data(cfg, corpus, p.data_dir, spec.seq_len);
      check_eval_tokens(cfg, spec, data, key, corpus,
                        trained_with == meta.end() ? std::string() : trained_with->second);
      val = models::data::read_shard(data.val_path);
      val_from = data.val_path;
    }
    check_eval_memory_fits(cfg, spec);
    // Only theta_global is evaluated: the workers' state (which a resume needs) may be missing.
    const int64_t n_params = models::closed_form_param_count(spec);
    at::Tensor theta = at::empty({n_params}, at::kFloat);
    copy_theta(c, checkpoint_path, theta.data_ptr<float>(), n_params);
    models::data::check_token_ids(val, spec.vocab_size, val_from);
    models::gpt model(spec, cfg.model.dtype == config::model_dtype::bf16 ? at::kBFloat16 : at::kFloat);
    model.load_flat(theta);
    int64_t n = batches > 0 ? batches : cfg.eval.batches;
    if (const int64_t most = models::data::max_validation_batches(val, cfg.train.batch_size, spec.seq_len);
        n > most) {
      spdlog::info(
          "eval: {} {} is more than the {} batches the validation set holds without repeating a window; "
          "using {}",
          batches > 0 ? "--batches" : "the checkpoint's eval.batches =", n, most, most);
      n = most;
    }
    auto last = std::chrono::steady_clock::now();
    const double loss = models::validation_loss(model, val, cfg.train.batch_size, n, [&](int64_t done) {
      if (std::chrono::steady_clock::now() - last < std::chrono::seconds(10)) return;
      last = std::chrono::steady_clock::now();
      spdlog::info("eval: {} of {} batches", done, n);
    });
    std::printf("checkpoint %s: val loss %.4f, val perplexity %s (%ld batches)\n",
                checkpoint_label(c).c_str(), loss, readable(std::exp(loss), 3).c_str(), n);
    return 0;
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const lw_error& e) {
    spdlog::error("{}: {}", to_string(e.code()), e.what());
    // The named checkpoint or the user's shards: bad input, as for export and run.
    return loading || e.code() == errc::corrupt_data || e.code() == errc::corrupt_checkpoint ||
                   e.code() == errc::invalid_config
               ? 2
               : 1;
  } catch (const c10::Error& e) {
    spdlog::error("torch: {}", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", describe(e));
    return 1;
  }
}

}  // namespace longwave::actors
