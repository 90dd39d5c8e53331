// Start-up of one run before any actor: the corpus, the model shape, --dry-run, the shared run_context.
#include "actors/run_setup.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "config/config_loader.hpp"
#include "models/data/corpus.hpp"
#include "models/data/data_fingerprint.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/data/file_io.hpp"
#include "models/data/shard.hpp"
#include "models/data/tokenizer.hpp"
#include "models/data/window_sampler.hpp"
#include "models/gpu_info.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/files/directory.hpp"
#include "runtime/log/log.hpp"
#include "runtime/memory/allocator.hpp"
#include "runtime/process/cores.hpp"

namespace fs = std::filesystem;

namespace longwave::actors {

namespace {

/// An explicit model.vocab_size below the data's ids: config_error naming it.
void check_vocab_holds(const config::train_config& cfg, int64_t data_vocab) {
  if (cfg.model.vocab_size > 0 && cfg.model.vocab_size < data_vocab)
    throw config::config_error("model.vocab_size",
                               "model.vocab_size = " + std::to_string(cfg.model.vocab_size) +
                                   ": the data has token ids up to " + std::to_string(data_vocab - 1));
}

/// The model's vocabulary: model.vocab_size, which must hold ready shards' ids (checked before a dry run
/// says yes; a corpus's tokenizer is checked with the config), else the data's.
int64_t expected_vocab(const config::train_config& cfg, const std::string& corpus) {
  std::error_code ec;
  if (cfg.model.vocab_size > 0 && !std::filesystem::is_directory(corpus, ec)) return cfg.model.vocab_size;
  const int64_t data = models::data::data_vocab(corpus, cfg.data.tokenizer, cfg.data.bpe_vocab_size);
  if (cfg.model.vocab_size == 0) return data;
  check_vocab_holds(cfg, data);
  return cfg.model.vocab_size;
}

bool is_streaming(const config::train_config& cfg) {
  return cfg.run.mode == config::run_mode::diloco && cfg.diloco.outer == config::outer_policy_kind::streaming;
}

std::shared_ptr<const std::vector<uint16_t>> load_tokens(const std::string& path) {
  return std::make_shared<const std::vector<uint16_t>>(models::data::read_shard(path));
}

/// The private copies eval keeps: the newest few by use, so that evaluating many runs does not fill the disk.
constexpr size_t eval_copies_kept = 4;

/// Removes the copies in `root` other than `used` beyond the newest eval_copies_kept - 1 (by their time of
/// last use), none that a process prepares; marks `used` as used now.
void prune_eval_copies(const fs::path& root, const fs::path& used) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> others;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && e.path().filename() != used.filename())
      others.emplace_back(fs::last_write_time(e.path(), ec), e.path());
  if (fs::exists(used, ec)) fs::last_write_time(used, fs::file_time_type::clock::now(), ec);
  if (others.size() < eval_copies_kept) return;
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> removed;
  for (size_t i = eval_copies_kept - 1; i < others.size(); ++i)
    if (models::data::remove_unless_preparing(others[i].second.string()))
      removed.push_back(others[i].second.filename().string());
  if (!removed.empty())
    spdlog::info("data: removed {} older private cop{} from {} ({}); the newest {} are kept", removed.size(),
                 removed.size() == 1 ? "y" : "ies", root.string(), fmt::join(removed, ", "),
                 eval_copies_kept);
}

}  // namespace

std::string corpus_path(const config::train_config& cfg) {
  const std::string path = cfg.data.path.empty() ? models::data::default_corpus_path() : cfg.data.path;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory)  // a symlink loop, a directory it may not search
      throw config::config_error("data.path", "data.path = \"" + path + "\": " + ec.message());
    if (cfg.data.path.empty())
      throw config::config_error("data.path", "data.path: the default corpus " + path +
                                                  " is missing; run scripts/setup (it writes the KJV text) "
                                                  "or set data.path to a text, JSONL or shard directory");
    throw config::config_error("data.path", "data.path = \"" + path + "\": no such file or directory");
  }
  if (const auto why = not_a_corpus(path); !why.empty())
    throw config::config_error("data.path", "data.path = \"" + path + "\": " + why);
  return path;
}

std::string not_a_corpus(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec) || fs::is_directory(path, ec)) return {};
  return "a device, a pipe or a socket, not a corpus: name a text or JSONL file, or a directory of shards";
}

models::model_spec model_spec_of(const config::train_config& cfg, const std::string& corpus) {
  auto spec = models::spec_of(cfg.model, expected_vocab(cfg, corpus));
  check_memory_fits(cfg, spec);
  return spec;
}

int64_t gpu_worker_bytes(const config::train_config& cfg, const models::model_spec& spec) {
  // A replica's training memory and its pseudo-gradient's device buffer (inner_trainer::pseudo_gradient);
  // where the node's mean is taken on the GPU, one more: the mean's buffer, or a worker's second Δ while the
  // mean still holds its first (counted for every worker: an upper bound).
  const int64_t delta = models::closed_form_param_count(spec) * static_cast<int64_t>(sizeof(float));
  return models::training_memory_bytes(spec, cfg.train.batch_size / cfg.train.micro_batches,
                                       cfg.model.dtype == config::model_dtype::bf16) +
         delta * (averages_plain_deltas(cfg) ? 2 : 1);
}

namespace {

/// train.deterministic (models::use_deterministic_kernels).
void apply_determinism(const config::train_config& cfg) {
  if (cfg.train.deterministic) models::use_deterministic_kernels();
}

}  // namespace

models::device_plan plan_devices(const config::train_config& cfg, const models::model_spec& spec) {
  auto plan = models::plan_devices(cfg.train.device, cfg.train.workers);
  for (const auto& d : plan.workers) (void)models::resolve_autocast(cfg.train.autocast, d);
  if (plan.any_cuda()) {
    const auto over = models::gpu_overcommit(plan, gpu_worker_bytes(cfg, spec), models::gpu_total_memory);
    if (!over.empty())
      throw config::config_error(
          "train.batch_size",
          fmt::format("train.batch_size = {}: the memory estimate does not fit ({}); {}",
                      cfg.train.batch_size, over, memory_advice(cfg, spec.seq_len, true)));
  }
  apply_determinism(cfg);
  return plan;
}

namespace {

/// train.threads, or for 0 the cores this process may use (its affinity, or OMP_NUM_THREADS) split among
/// the workers: the machine's count over-subscribed a container limited to a few cores, or runs side by side.
/// At most train.threads' own bound, 1024 (OMP_NUM_THREADS=2100 gave 1050 threads a worker).
int64_t threads_per_worker(const config::train_config& cfg) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  const auto share = static_cast<int64_t>(runtime::torch_thread_budget().threads) / cfg.train.workers;
  return std::clamp<int64_t>(share, 1, 1024);
}

}  // namespace

void print_dry_run(const config::train_config& cfg, const models::model_spec& spec,
                   const models::device_plan& devices) {
  const int64_t n = models::closed_form_param_count(spec);
  const int64_t mem =
      models::training_memory_bytes(spec, cfg.train.batch_size, cfg.model.dtype == config::model_dtype::bf16);
  std::printf("%s\n", config::to_toml(cfg).c_str());
  std::printf(
      "# model: preset %s, dim %ld, layers %ld, heads %ld (kv %ld), ffn %ld, vocab %ld, context %ld\n",
      spec.preset.c_str(), spec.dim, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.ffn_hidden,
      spec.vocab_size, spec.seq_len);
  std::printf("# parameters: %ld (%.2fM)\n", n, static_cast<double>(n) / 1e6);
  std::printf("# device: %s; autocast: %s; micro-batches: %ld; deterministic: %s\n",
              devices.describe().c_str(),
              config::to_string(models::resolve_autocast(cfg.train.autocast, devices.workers.front())),
              cfg.train.micro_batches, cfg.train.deterministic ? "yes" : "no");
  const auto budget = runtime::torch_thread_budget();
  const auto why =
      cfg.train.threads > 0
          ? std::string("train.threads")
          : fmt::format("train.threads = 0: {} {} / {} workers", budget.threads,
                        budget.from_omp_env ? "(OMP_NUM_THREADS)" : "usable CPUs", cfg.train.workers);
  std::printf("# torch threads: %ld per worker (%s)\n", threads_per_worker(cfg), why.c_str());
  if (devices.any_cuda()) {
    const auto& first = devices.workers.front() == "cpu" ? devices.workers.back() : devices.workers.front();
    std::printf("# GPU memory estimate: %.1f GiB per worker (%s has %.1f GiB)\n",
                static_cast<double>(gpu_worker_bytes(cfg, spec)) / (1 << 30), first.c_str(),
                static_cast<double>(models::gpu_total_memory(std::stoi(first.substr(5)))) / (1 << 30));
  }
  const double all = models::process_memory_bytes(
      spec, cfg.train.batch_size, cfg.model.dtype == config::model_dtype::bf16, cfg.train.workers);
  std::printf(
      "# memory estimate: %.1f MiB per worker, %.1f MiB for %ld workers and theta_global's copies (this "
      "machine: %.1f MiB)\n",
      static_cast<double>(mem) / (1 << 20), all / (1 << 20), cfg.train.workers,
      static_cast<double>(runtime::physical_memory_bytes()) / (1 << 20));
  // validate() bounds the steps; their tokens may pass 64 bits on a config of a billion rounds.
  const int64_t steps = cfg.train.rounds * cfg.train.inner_steps;
  int64_t tokens = 0;
  const bool fits = !__builtin_mul_overflow(steps, cfg.train.batch_size * cfg.model.seq_len, &tokens);
  std::printf("# inner steps per worker: %ld (%ld rounds x H=%ld); tokens per worker: %s\n", steps,
              cfg.train.rounds, cfg.train.inner_steps,
              fits ? std::to_string(tokens).c_str() : "more than 2^63");
}

void make_run_directory(const std::string& key, const std::string& dir) {
  if (const auto why = runtime::make_directories(dir); !why.empty())
    throw config::config_error(key, key + " = \"" + dir + "\": " + why);
}

void make_data_directory(const config::train_config& cfg, const std::string& corpus,
                         const std::string& data_dir) {
  std::error_code ec;
  if (fs::is_directory(corpus, ec)) return;  // shards, read where they are
  make_run_directory(cfg.data.cache_dir.empty() ? "run.out_dir" : "data.cache_dir", data_dir);
}

models::data::prepared_dataset prepare_data(const config::train_config& cfg, const std::string& corpus,
                                            const std::string& data_dir,
                                            std::function<void(const std::string&)> log) {
  if (!log) log = [](const std::string& line) { spdlog::info("{}", line); };
  return models::data::prepare_dataset(corpus, cfg.data.tokenizer, cfg.data.bpe_vocab_size,
                                       cfg.data.val_fraction, data_dir, std::move(log));
}

models::data::prepared_dataset find_or_prepare_data(const config::train_config& cfg,
                                                    const std::string& corpus, const std::string& data_dir,
                                                    int64_t seq_len) {
  std::string why;
  if (auto d = models::data::find_prepared(corpus, cfg.data.tokenizer, cfg.data.bpe_vocab_size,
                                           cfg.data.val_fraction, data_dir, why)) {
    spdlog::info("data: using the run's shards in {} ({} val tokens)",
                 std::filesystem::path(d->val_path).parent_path().string(), d->n_val_tokens);
    return *d;
  }
  const std::string own = (std::filesystem::path(models::data::cache_root()) / "eval-data" /
                           models::data::data_cache_key(corpus, cfg.data.tokenizer, cfg.data.bpe_vocab_size,
                                                        cfg.data.val_fraction))
                              .string();
  spdlog::info(
      "data: the run's data directory {} does not hold its data ({}); using a private copy in {} and "
      "leaving the run's directory as it is",
      data_dir, why, own);
  std::error_code ec;
  const bool made = !fs::exists(own, ec);
  try {
    auto data = prepare_data(cfg, corpus, own);
    // Before the older copies make room for it: one that cannot be evaluated goes instead.
    (void)models::data::max_validation_batches(models::data::read_shard(data.val_path), cfg.train.batch_size,
                                               seq_len);
    prune_eval_copies(fs::path(own).parent_path(), own);
    return data;
  } catch (...) {
    if (made) models::data::remove_unless_preparing(own);  // a copy of data that cannot be read: for nothing
    throw;
  }
}

std::shared_ptr<run_context> make_context(const config::train_config& cfg, models::model_spec spec,
                                          const std::string& corpus, const std::string& data_dir,
                                          const models::device_plan& devices, cluster_link& cluster) {
  auto data = prepare_data(cfg, corpus, data_dir);
  check_vocab_holds(cfg, data.vocab_size);
  spec.vocab_size = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : data.vocab_size;

  auto ctx = std::make_shared<run_context>();
  ctx->cfg = cfg;
  ctx->data_fingerprint = models::data::data_fingerprint(corpus);
  if (!data.tokenizer_path.empty()) {
    const auto tok = models::data::parse_tokenizer(models::data::read_file(data.tokenizer_path, "tokenizer"),
                                                   data.tokenizer_path);
    ctx->tokenizer = models::data::tokenizer_label(*tok);
    // Its canonical text: nodes whose copies differ only in line ends serve a joiner the same state.
    ctx->tokenizer_text = std::make_shared<const std::string>(tok->text());
  }
  ctx->spec = spec;
  ctx->inner = make_inner_options(cfg);
  ctx->planned_steps = ctx->inner.total_steps;
  ctx->devices = devices;
  ctx->config_toml = config::to_toml(cfg);
  ctx->train_tokens = load_tokens(data.train_path);
  ctx->val_tokens = load_tokens(data.val_path);
  models::data::check_token_ids(*ctx->train_tokens, spec.vocab_size, data.train_path);
  models::data::check_token_ids(*ctx->val_tokens, spec.vocab_size, data.val_path);
  ctx->threads_per_worker = threads_per_worker(cfg);
  ctx->cluster = &cluster;
  const ring_place* place = cluster.place();
  if (place) {
    ctx->rank_offset = place->rank_offset;
    ctx->cluster_workers = place->cluster_workers;
    ctx->data_partitions = place->data_partitions;
  }
  if (is_streaming(cfg))
    ctx->fragments = models::fragment_ranges(spec, cfg.diloco.fragments,
                                             cfg.diloco.fragment_pattern == config::fragment_layout::strided);
  if (const int64_t k = cfg.federated.clients_per_round; k > 0) {
    if (k > ctx->data_parts())
      throw config::config_error(
          "federated.clients_per_round",
          fmt::format("federated.clients_per_round = {}: the run has {} clients (workers) to draw from", k,
                      ctx->data_parts()));
    // A client trains in k of M rounds on average: its learning-rate schedule spans the steps it expects.
    ctx->inner.total_steps = std::max<int64_t>(1, ctx->inner.total_steps * k / ctx->data_parts());
    spdlog::info("federated: {} of {} clients train each round (seed {}); a client's schedule spans {} steps",
                 k, ctx->data_parts(), cfg.run.seed, ctx->inner.total_steps);
  }
  if (cfg.data.partition == config::data_partition::books && !data.docs_path.empty())
    ctx->train_docs = models::data::read_document_starts(data.docs_path);
  // Every part must hold a window (the errors name data.partition and the sizes).
  int64_t smallest = INT64_MAX, largest = 0;
  for (int64_t part = 0; part < ctx->data_parts(); ++part) {
    models::data::window_sampler probe(ctx->train_tokens, ctx->data_spans(part), part, cfg.train.batch_size,
                                       spec.seq_len, cfg.run.seed);
    int64_t tokens = 0;
    for (const auto& s : probe.spans()) tokens += s.end - s.begin;
    smallest = std::min(smallest, tokens);
    largest = std::max(largest, tokens);
  }
  spdlog::info("data: partition {}: {} parts of {}..{} train tokens{}", config::to_string(cfg.data.partition),
               ctx->data_parts(), smallest, largest,
               ctx->train_docs.empty() ? "" : fmt::format(" ({} documents)", ctx->train_docs.size()));
  (void)models::data::validation_batch(*ctx->val_tokens, 0, cfg.train.batch_size, spec.seq_len);
  // An evaluation averages each window of the validation set at most once, as `longwave eval` does (the run
  // repeated windows, so the two differed, and a huge eval.batches ran for hours).
  if (const int64_t most =
          models::data::max_validation_batches(*ctx->val_tokens, cfg.train.batch_size, spec.seq_len);
      cfg.eval.batches > most) {
    spdlog::info(
        "eval: eval.batches = {} is more than the {} batches the validation set holds without "
        "repeating a window; each evaluation uses {}",
        cfg.eval.batches, most, most);
    ctx->cfg.eval.batches = most;
  }
  spdlog::info("data: {} train tokens, {} val tokens, vocab {}", ctx->train_tokens->size(),
               ctx->val_tokens->size(), spec.vocab_size);
  return ctx;
}

runtime::snapshot_shape shape_of(const run_context& ctx) {
  return {models::closed_form_param_count(ctx.spec),
          ctx.cfg.train.workers,
          config::to_string(ctx.cfg.run.mode),
          models::model_label(ctx.spec),
          config::to_string(ctx.cfg.diloco.outer),
          ctx.data_fingerprint,
          ctx.data_parts(),
          ctx.rank_offset,
          ctx.tokenizer,
          ctx.tokenizer_text};
}

}  // namespace longwave::actors
