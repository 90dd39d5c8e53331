#pragma once
// `longwave sample CHECKPOINT`: text from a checkpoint's theta_global, token by token on the CPU, with the
// run's own tokenizer; what a trained model says, without exporting it first.
#include <cstdint>
#include <string>

namespace longwave::cli {

/// What `sample` was asked to do.
struct sample_options {
  std::string checkpoint;    ///< a .lwc file or a checkpoint directory (its newest valid file)
  std::string prompt;        ///< "" starts from a line break
  int64_t tokens = 200;      ///< new tokens to write
  double temperature = 0.8;  ///< 0: always the likeliest token
  int64_t top_k = 40;        ///< draw among the k likeliest (0: all)
  uint64_t seed = 1;
};

/// Writes the prompt and the new text to stdout, what it did to stderr. Returns the exit code: 0 written;
/// 2 a missing, corrupt or unusable checkpoint, or no tokenizer of the run found; 1 a failure while running.
int sample_checkpoint(const sample_options& o);

}  // namespace longwave::cli
