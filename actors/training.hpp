#pragma once
// One training run in this process: prepare data, resume or start, spawn the actor graph, wait for it,
// handle Ctrl-C. The CLI's `run` and the integration tests call this.
#include <string>

#include "config/train_config.hpp"

namespace longwave::actors {

/// Options of one invocation that are not part of the config.
struct run_options {
  bool fresh = false;          ///< ignore (and remove) earlier checkpoints of this out_dir
  bool dry_run = false;        ///< validate, print the resolved config and the model size, do not train
  bool handle_signals = true;  ///< SIGINT/SIGTERM stop cleanly (exit code 130)
};

/// Exit codes: 0 done, 1 runtime failure, 2 bad config or input, 130 stopped by a signal.
int run_training(const config::train_config& cfg, const run_options& opts);

/// The bundled default corpus: $LONGWAVE_CORPUS, else ${XDG_CACHE_HOME:-~/.cache}/longwave/kjv.txt
/// (written by scripts/setup).
std::string default_corpus_path();

/// `longwave eval CHECKPOINT`: validation loss and perplexity of theta_global in a checkpoint file (or the
/// newest valid one in a directory). Returns the exit code.
int run_eval(const std::string& checkpoint_path, int64_t batches);

}  // namespace longwave::actors
