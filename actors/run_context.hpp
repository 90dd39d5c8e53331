#pragma once
// What every actor of one training run shares read-only: the resolved config, the model shape and the data.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.hpp"
#include "models/device.hpp"
#include "models/inner_trainer.hpp"
#include "models/model_spec.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/json/json_line.hpp"

namespace longwave::actors {

class cluster_link;
cluster_link& no_cluster();

/// How a node that joined a running cluster got its state (metrics.jsonl "recovery", /metrics).
struct recovery_info {
  uint64_t round = 0;   ///< the completed round of the state
  uint64_t epoch = 0;   ///< the epoch it was admitted in
  uint32_t rank = 0;    ///< its rank there
  std::string members;  ///< that epoch's members, "n0,n1,n2"
  std::string source;   ///< "n0, n1" (fetched from), or "own checkpoint"
  uint64_t bytes = 0;   ///< fetched (0: its own checkpoint)
  double seconds = 0;   ///< fetching took
};

/// Immutable after start-up; actors hold it by shared_ptr.
struct run_context {
  config::train_config cfg;
  std::string config_toml;  ///< the resolved config, stored in every checkpoint
  models::model_spec spec;
  models::inner_options inner;
  /// Where each local worker steps (train.device planned for this process).
  models::device_plan devices;
  std::shared_ptr<const std::vector<uint16_t>> train_tokens;
  std::shared_ptr<const std::vector<uint16_t>> val_tokens;
  /// Token offsets of the train documents' starts (data::document_starts); empty when the data has none.
  std::vector<int64_t> train_docs;
  int64_t threads_per_worker = 1;
  /// Cluster runs: global rank of this node's first worker and the workers of the whole cluster. Each worker
  /// samples the data region of its global rank.
  int64_t rank_offset = 0;
  int64_t cluster_workers = 0;  ///< 0: this process is the whole run
  /// Parts the training data is split into (one per global rank; more than cluster_workers in a cluster
  /// that nodes not in the file may join). 0: global_workers().
  int64_t data_partitions = 0;
  /// diloco.outer = "streaming": the ranges of theta of each fragment (models::fragment_ranges); else empty.
  std::vector<models::flat_ranges> fragments;
  /// A node that joined a running cluster: its first round, in which it only observes (ring_place).
  uint64_t observe_round = 0;
  /// The cluster this node belongs to: round-boundary states to serve to joiners, theta_global's CRC-32C
  /// after each round (cluster_link.hpp). Outlives the actors; no_cluster() for one process alone.
  cluster_link* cluster = &no_cluster();
  /// Started with --fresh: the same command again would start over, so a stop says to drop it to resume.
  bool started_fresh = false;
  /// A node that joined a running cluster: how it got its state.
  std::optional<recovery_info> recovery;
  /// The training data's fingerprint (models::data::data_fingerprint of the corpus), stored in each
  /// checkpoint: a resume on other data says so.
  uint64_t data_fingerprint = 0;
  /// The run's tokenizer as each checkpoint records it (runtime::snapshot_shape::tokenizer), and its text.
  std::string tokenizer;
  std::shared_ptr<const std::string> tokenizer_text;
  /// "" while this process still holds its out_dir's (and checkpoint.dir's) lock file; else what happened to
  /// it (runtime::run_lock::lost). Checked before each checkpoint write. Unset: always "".
  std::function<std::string()> lock_lost;
  int64_t n_workers() const { return cfg.train.workers; }
  int64_t global_workers() const { return cluster_workers > 0 ? cluster_workers : cfg.train.workers; }
  int64_t data_parts() const { return data_partitions > 0 ? data_partitions : global_workers(); }
  /// The train tokens global rank `global_rank` reads (data.partition over data_parts()).
  std::vector<models::data::token_span> data_spans(int64_t global_rank) const;
  /// The inner step the run ends at: train.rounds × train.inner_steps, or after a resume under another
  /// train.inner_steps, the checkpoint's steps and the rounds left at the new H (plan_resumed_run).
  int64_t planned_steps = 0;
  /// The inner options of local worker `rank`: `inner` on its device, with its autocast.
  models::inner_options inner_of(int64_t rank) const;
  /// The node's workers share one GPU and its policy averages their plain pseudo-gradients (diloco with
  /// sync, delayed or streaming, client sampling included): the mean is taken on that GPU, and one copy
  /// leaves it (issue 38). eager and async use each worker's own on the host; ddp stages its gradients.
  bool mean_on_device() const;
};

/// The policy averages the workers' plain pseudo-gradients (diloco with sync, delayed or streaming): a node
/// whose workers share a GPU can take their mean there (run_context::mean_on_device).
bool averages_plain_deltas(const config::train_config& cfg);

/// metrics.jsonl's `start` record of a session of this run that resumed at inner step `resumed_step` (0:
/// none).
runtime::json_line start_record(const run_context& ctx, int64_t resumed_step, uint64_t resumed_round);

/// metrics.jsonl's `eval` record: the validation loss of theta after `round` (at inner step `step`).
runtime::json_line eval_record(uint64_t round, int64_t step, double loss);

/// metrics.jsonl's `end` record of a session that ends with exit `code` after `seconds`.
runtime::json_line end_record(int code, double loss, double seconds, int64_t steps, uint64_t rounds);

/// Inner-loop options from the config.
models::inner_options make_inner_options(const config::train_config& cfg);

/// What a run out of memory can change, only the knobs that can go further ("lower train.batch_size, ...
/// or use a smaller model.preset or shape ..."): a batch of 1 or one worker is not advised lower. `gpu`:
/// train.micro_batches and workers per GPU.
std::string memory_advice(const config::train_config& cfg, int64_t seq_len, bool gpu);

/// Refuses (config_error naming train.batch_size, with the estimate and the memory) a run whose memory
/// estimate for this process (models::process_memory_bytes: its workers and theta_global) exceeds the
/// machine's physical memory: it would end in a bad_alloc or the OOM killer after start-up.
void check_memory_fits(const config::train_config& cfg, const models::model_spec& spec);
/// The same for `longwave eval` of a checkpoint whose stored config names the model (exit 2, before any
/// allocation: a crafted config must not reach the allocator or the OOM killer).
void check_eval_memory_fits(const config::train_config& cfg, const models::model_spec& spec);

}  // namespace longwave::actors
