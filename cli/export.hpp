#pragma once
// `longwave export CHECKPOINT --format safetensors --out DIR`: a checkpoint's theta_global as Hugging Face
// Llama weights (model.safetensors, config.json, and the run's tokenizer file when there is one).
#include <string>

namespace longwave::cli {

/// What `export` was asked to do.
struct export_options {
  std::string checkpoint;  ///< a .lwc file or a checkpoint directory (its newest valid file)
  std::string format = "safetensors";
  std::string out_dir;
  bool force = false;  ///< overwrite the files of an earlier export in a non-empty out_dir
  /// Diagnostic (hidden): our model's logits for these comma-separated token ids, written to logits_out as
  /// "T V" then one line of V values per position, to check an export against another implementation.
  std::string logits_for, logits_out;
};

/// Returns the exit code: 0 written; 2 a missing, corrupt or unusable checkpoint, an unknown format, an
/// out_dir that is a file or is not empty (without --force), bad --logits-for ids; 1 a failed write.
int export_checkpoint(const export_options& o);

}  // namespace longwave::cli
