#pragma once
// A checkpoint's theta_global with the model and the tokenizer it belongs to: what `export` writes out and
// `sample` runs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.hpp"
#include "models/model_spec.hpp"

namespace longwave::cli {

/// theta_global of a checkpoint and the model it belongs to.
struct checkpoint_model {
  models::model_spec spec;
  std::vector<float> theta;
  config::train_config cfg;
  std::string label;  ///< actors::checkpoint_label: "round R, inner step S" (async: phase and version)
  std::string tokenizer_text;  ///< the tokenizer file the checkpoint carries ("": an older one carries none)
};

/// Reads a .lwc file or a checkpoint directory's newest valid file. Throws lw_error (io_error,
/// corrupt_checkpoint) or config_error: all bad input.
checkpoint_model load_checkpoint_model(const std::string& path);

/// A tokenizer file's text and where it came from (a path, or "the checkpoint").
struct tokenizer_file {
  std::string text;
  std::string from;
};

/// The run's tokenizer: the one the checkpoint carries; for an older checkpoint, a file that matches the
/// model's vocabulary and the stored data.tokenizer: first beside the checkpoint directory (where an archived
/// or copied run keeps it), then the stored data_dir (another run may have reused that out_dir since), then
/// data.path. `who` prefixes the note on a file passed over ("export").
std::optional<tokenizer_file> find_tokenizer(const checkpoint_model& m, const std::string& ckpt_path,
                                             const char* who);

}  // namespace longwave::cli
