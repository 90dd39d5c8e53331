#pragma once
// train_snapshot <-> checkpoint blobs: names, sizes and meta, validated against the run that loads them.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/messages/messages.hpp"

namespace longwave::runtime {

/// Separates the key=value meta lines from the resolved config TOML that follows in a checkpoint's meta.
inline constexpr const char* config_marker = "--- config ---\n";

/// What a checkpoint must match to be resumed by this run.
struct snapshot_shape {
  int64_t n_params = 0;
  int64_t n_replicas = 0;
  std::string mode;
  std::string preset;
  std::string outer = "sync";  ///< diloco.outer: a checkpoint of "async" resumes only under "async", and back
  uint64_t data = 0;  ///< the training data's fingerprint (models::data::data_fingerprint; 0: not known)
  /// The parts the data is split into and the global rank of this process's first worker: a cluster resumed
  /// with nodes added to or removed from its file reads other parts (0 parts: not known, older files).
  int64_t data_parts = 0;
  int64_t rank_offset = 0;
  /// The run's tokenizer: its kind, vocabulary and CRC-32C ("bpe vocab=500 crc32c=8e9e6f21"; "": none, as
  /// for shards without one), and its file's text, which each checkpoint carries (sample and export use it).
  std::string tokenizer;
  std::shared_ptr<const std::string> tokenizer_text;
};

/// The key=value lines of a checkpoint's meta (mode, preset, n_params, replicas, ...), up to config_marker.
std::map<std::string, std::string> parse_meta(const std::string& meta);

/// "" when a checkpoint with this meta read the data as `shape` does; else a warning that the split changed
/// (a cluster resumed with nodes added to or removed from its file). Older checkpoints say nothing of it: "".
std::string split_change(const std::string& meta, const snapshot_shape& shape);

/// A replica's "replica<r>/counters" blob: three int64 a run writes.
struct replica_counters {
  int64_t adam_steps = 0;
  int64_t sampler_position = 0;
  int64_t steps_in_round = 0;
};
/// The largest count a replica's counters may hold: 2^40 steps is 35 years at a step a millisecond, and the
/// token counts a resume derives from them (position x tokens a batch) stay far from int64's end.
inline constexpr int64_t max_replica_count = int64_t{1} << 40;
/// Replica r's counters in `c`, or std::nullopt when it holds none of their size (they are not checked).
std::optional<replica_counters> counters_of(const checkpoint& c, int64_t r);

/// Blobs share the tensors' storage (no copy); the tensors must be contiguous fp32 and not change afterwards.
checkpoint to_checkpoint(const train_snapshot& s, const snapshot_shape& shape);
/// Throws lw_error(corrupt_checkpoint) naming what does not match (e.g. "written for 4 workers, this run has
/// 2"), or a tensor with NaN or infinite values, which no run writes.
train_snapshot from_checkpoint(checkpoint&& c, const snapshot_shape& shape);

/// The name of the snapshot's first tensor with NaN or infinite values ("" if none): a diverged state is
/// never written, since it would rotate the good checkpoints out.
std::string first_non_finite(const train_snapshot& snap);

/// What shows that `c` was written by a run of another shape (mode, model, workers, outer step, parameter
/// count), or "": a checkpoint with such a problem is no damage, and its older neighbours share it.
std::string shape_problem(const checkpoint& c, const snapshot_shape& shape);

}  // namespace longwave::runtime
