#pragma once
// Where one run keeps its files and where it starts: the out_dir's paths, the checkpoint to resume (or
// --fresh), and the loss trace and config copy made ready for this session.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/training.hpp"
#include "config/train_config.hpp"
#include "models/model_spec.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/messages/messages.hpp"

namespace longwave::actors {

/// The files of one run: run.out_dir, data.cache_dir (default out_dir/data), checkpoint.dir (default
/// out_dir/checkpoints), the loss trace and the resolved config's copy.
struct run_paths {
  std::string out_dir, data_dir, ckpt_dir, trace, config_copy;
};

run_paths resolve_paths(const config::train_config& cfg);

/// Where the run starts: a snapshot to resume (none: from scratch), or nothing to do.
struct start_point {
  std::optional<runtime::train_snapshot> resume;
  bool complete = false;        ///< the checkpoint already holds train.rounds rounds
  int corrupt_checkpoints = 0;  ///< skipped files, counted in longwave_errors_total once metrics run
  std::string resumed_from;     ///< the checkpoint file `resume` came from ("" for a fresh start)
};

/// The files a run writes in its out_dir (the loss trace, metrics.jsonl, result.json, the config copy) that
/// exist as a FIFO or a socket (opening a FIFO blocks the run for good): config_error naming run.out_dir and
/// the file. A directory there is said when the file is opened, and the run goes on without it; a device
/// (a link to /dev/null) takes the writes.
void check_run_files(const run_paths& p);

/// --fresh removes the checkpoints and the trace; otherwise the newest valid checkpoint (a cluster node: at
/// most the agreed round) is the start. Strays in the checkpoint directory are named first.
start_point find_start(const config::train_config& cfg, const run_options& opts, const run_paths& p,
                       const runtime::snapshot_shape& shape);

/// What result.json says of a finished run: the numbers a sweep or a test reads back.
struct run_result {
  uint64_t rounds = 0;  ///< completed outer rounds
  int64_t steps = 0;    ///< inner steps per worker
  double val_loss = 0;  ///< the final evaluation's (not finite: null)
  int64_t tokens = 0;
  double seconds = 0, train_seconds = 0;  ///< the last session's wall time, less its evaluations
};

/// Writes out_dir/result.json whole (write_atomically); "" or what failed.
std::string write_result_file(const config::train_config& cfg, const run_result& r);

/// Whether out_dir's result.json describes the run at `snap` (its rounds and inner steps): a run killed
/// during its final evaluation kept an earlier session's, or none.
bool result_describes(const std::string& out_dir, const runtime::train_snapshot& snap);

/// The inner step a run resumed from `snap` ends at: its steps, the rest of its round (a round past a lowered
/// train.inner_steps ends at once) and the rounds left, each train.inner_steps long. rounds × H when H never
/// changed.
int64_t planned_last_step(const config::train_config& cfg, const runtime::train_snapshot& snap);

/// A resume under another train.inner_steps than the checkpoint's steps were taken with: the run's end step
/// and the learning-rate schedule's length follow planned_last_step, so the schedule ends at the last step
/// (async, client sampling and adaptive steps keep theirs: their steps do not count rounds × H).
void plan_resumed_run(run_context& ctx, const runtime::train_snapshot& snap);

/// Moves checkpoint files that failed their checks (checkpoint_store::load_latest's `corrupt`) to the store's
/// corrupt/ folder, a line each: a training start's part, never eval's or export's.
void set_aside_corrupt(const runtime::checkpoint_store& store, const std::vector<std::string>& files);

/// A node that joined a running cluster starts from the members' state, its replicas copies of the one that
/// state carries, or from its own checkpoint of the same round. Either way every replica's step count and
/// data position move past the round it observes (ring_place::observe_round), so it reads the windows
/// its global ranks read at that step and trains at the cluster's place in the LR schedule. Throws
/// lw_error(corrupt_checkpoint) when its own checkpoint of that round cannot be loaded.
/// diloco.outer = "async": no round is observed; the joiner's rounds go on after its own newest checkpoint's
/// (`own`; empty: none, or --fresh), and its workers read their own data on from their positions there (the
/// fetched state's are another node's, on its data).
start_point joined_start(const config::train_config& cfg, const run_options& opts, const run_paths& p,
                         const runtime::snapshot_shape& shape, joined_state joined,
                         const own_checkpoint& own);

/// The resolved config in a checkpoint's meta; lw_error(corrupt_checkpoint) naming `path` when it has none.
/// A config that does not parse throws config_error.
config::train_config config_of(const std::string& meta, const std::string& path);

/// A checkpoint named on the command line (`eval`, `export`) and the resolved config its meta holds.
struct named_checkpoint {
  runtime::checkpoint ckpt;
  config::train_config cfg;
};

/// Loads a .lwc file, or the newest valid checkpoint of a directory, that holds a config, a theta of whole,
/// finite fp32 values its model fits, the model name in its meta the config gives, and a tokenizer (if it
/// carries one) that parses and is the one its meta names (in a directory, a newer one, corrupt or without
/// them, is named with spdlog::warn). Throws lw_error(io_error) when the path does not exist or the directory
/// holds no checkpoint, lw_error(corrupt_checkpoint) when the file (in a directory: every file) is invalid,
/// its theta is not such, or its meta has no config, and config_error when a named file's config is invalid.
named_checkpoint load_named_checkpoint(const std::string& path);

/// Where a checkpoint is, as eval, export and sample say it: "round R, inner step S", or for an asynchronous
/// run (its rounds are the node's own phases) "phase R, theta version V, inner step S".
std::string checkpoint_label(const runtime::checkpoint& c);

/// A checkpoint's theta_global (blob "theta"), checked to hold whole fp32 values, `n_params` of them when it
/// is positive (load_named_checkpoint has checked that they are finite). Throws lw_error(corrupt_checkpoint)
/// naming `path` and the round.
const runtime::checkpoint_blob& theta_blob(const runtime::checkpoint& c, const std::string& path,
                                           int64_t n_params = 0);

/// The model of a checkpoint's config whose theta holds `n_theta` values: its vocabulary is model.vocab_size,
/// or where that is 0 (taken from the data) the one theta's size gives. Throws lw_error(corrupt_checkpoint)
/// naming `path` when no vocabulary gives that size.
models::model_spec checkpoint_spec(const config::train_config& cfg, int64_t n_theta, const std::string& path);

/// Copies theta_blob(c, path, n_params)'s values into `out`, which holds that many floats (the blob's bytes
/// need not be float-aligned).
void copy_theta(const runtime::checkpoint& c, const std::string& path, float* out, int64_t n_params);

/// The loss trace cut back to the resumed step (or emptied), and the resolved config beside it (unless that
/// file is `config_file`, the one the run reads, or another file a run did not write). Returns whether this
/// session may append to the trace (false: it could not be cut back, a full disk say).
bool reset_run_files(const config::train_config& cfg, const run_paths& p, const start_point& start,
                     const std::string& config_file);

}  // namespace longwave::actors
