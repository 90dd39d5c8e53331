// Checkpoints named on the command line (eval, export, sample): the newest valid one of a directory, its
// stored config, and its theta_global (declared in actors/run_files.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "actors/run_files.hpp"
#include "config/config_loader.hpp"
#include "models/data/tokenizer.hpp"
#include "models/model_spec.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/log/log.hpp"

namespace fs = std::filesystem;

namespace longwave::actors {

using namespace longwave::runtime;

/// The resolved config in a checkpoint's meta; lw_error(corrupt_checkpoint) naming `path` when it has none.
/// A config that does not parse throws config_error.
config::train_config config_of(const std::string& meta, const std::string& path) {
  const auto pos = meta.find(config_marker);
  if (pos == std::string::npos) throw lw_error(errc::corrupt_checkpoint, path + ": no config in meta");
  // The paths are where the run was: they may be gone, or files, where the checkpoint is read now.
  return config::parse_config(meta.substr(pos + std::strlen(config_marker)), {}, path + "'s stored config",
                              {},
                              /*check_paths=*/false);
}

namespace {

/// theta_blob(c, path), whose values must be finite: no run writes NaN or infinity (the checkpointer refuses
/// a diverged state), so such a file was altered. Read once per command, here.
void check_theta_values(const checkpoint& c, const std::string& path) {
  const auto& blob = theta_blob(c, path);
  const auto* bytes = static_cast<const char*>(blob.data);
  for (size_t i = 0; i < blob.size; i += sizeof(float)) {
    float x;
    std::memcpy(&x, bytes + i, sizeof x);  // the blob's bytes need not be float-aligned
    if (!std::isfinite(x))
      throw lw_error(errc::corrupt_checkpoint,
                     fmt::format("{}: theta_global of round {} holds NaN or infinite values", path, c.round));
  }
}

/// The tokenizer a checkpoint carries must parse and be the one its meta names (kind, vocabulary, CRC-32C):
/// export copies it and sample reads with it, so a damaged one makes the file invalid for all of them.
void check_tokenizer(const checkpoint& c, const std::string& path) {
  const auto* b = c.find("tokenizer");
  if (!b || b->size == 0) return;  // a build before checkpoints carried one
  std::unique_ptr<models::data::tokenizer> tok;
  try {
    tok = models::data::parse_tokenizer(std::string(static_cast<const char*>(b->data), b->size),
                                        "its tokenizer");
  } catch (const lw_error& e) {
    throw lw_error(errc::corrupt_checkpoint,
                   fmt::format("{}: the tokenizer the checkpoint of round {} carries is damaged ({})", path,
                               c.round, e.what()));
  }
  const auto meta = parse_meta(c.meta);
  const auto named = meta.find("tokenizer");
  // Builds of one day before 2b6bd4a took the CRC-32C of the blob as written (and gave the byte tokenizer
  // one): their label is the blob's too.
  const auto as_written = fmt::format("{} vocab={} crc32c={:08x}", tok->kind(), tok->vocab_size(),
                                      runtime::crc32c(b->data, b->size));
  if (const auto label = models::data::tokenizer_label(*tok);
      named != meta.end() && named->second != label && named->second != as_written)
    throw lw_error(
        errc::corrupt_checkpoint,
        fmt::format("{}: the checkpoint of round {} carries the tokenizer '{}', its meta names '{}'", path,
                    c.round, label, named->second));
}

/// What a command reads of a checkpoint, checked once: finite theta values, a stored config, the model its
/// meta names (the shape eval, export and sample build), and the tokenizer it carries.
config::train_config checked_config(const checkpoint& c, const std::string& path) {
  check_theta_values(c, path);
  auto cfg = config_of(c.meta, path);
  const auto spec =
      checkpoint_spec(cfg, static_cast<int64_t>(theta_blob(c, path).size / sizeof(float)), path);
  const auto meta = parse_meta(c.meta);
  if (const auto it = meta.find("preset"); it != meta.end() && it->second != models::model_label(spec))
    throw lw_error(errc::corrupt_checkpoint,
                   fmt::format("{}: meta names model '{}', its stored config gives '{}'", path, it->second,
                               models::model_label(spec)));
  check_tokenizer(c, path);
  return cfg;
}

}  // namespace

named_checkpoint load_named_checkpoint(const std::string& path) {
  if (!fs::exists(path)) throw lw_error(errc::io_error, path + ": no such file or directory");
  if (!fs::is_directory(path)) {
    // A FIFO or a device would block the read or never end it.
    if (!fs::is_regular_file(path))
      throw lw_error(errc::io_error,
                     path + ": not a checkpoint file or directory (a FIFO, socket or device)");
    auto c = checkpoint_store::load_file(path);
    auto cfg = checked_config(c, path);
    return {std::move(c), std::move(cfg)};
  }
  // A directory: its newest file that holds a config and a theta (what eval and export read), as a run's
  // newest that passes its checksum but not that falls back to the one before.
  std::optional<config::train_config> cfg;
  checkpoint_store store(path, 1 << 30);
  std::optional<checkpoint> c;
  try {
    c = store.load_latest([](const std::string& w) { spdlog::warn("{}", w); },
                          [&](checkpoint& each) {
                            try {
                              cfg = checked_config(each, "the checkpoint");
                            } catch (const config::config_error& e) {
                              throw lw_error(errc::corrupt_checkpoint, e.what());
                            }
                          });
  } catch (const lw_error& e) {  // without the advice to a run that would start over: nothing starts here
    std::string what = e.what();
    if (const auto at = what.find("; move them aside"); at != std::string::npos) what.resize(at);
    throw lw_error(e.code(), what);
  }
  if (!c) {
    // A run's out_dir, or a cluster's (one folder a node), named instead of its checkpoints.
    std::error_code ec;
    std::vector<std::string> inner;
    if (fs::is_directory(fs::path(path) / "checkpoints", ec))
      inner.push_back((fs::path(path) / "checkpoints").string());
    for (fs::directory_iterator it(path, ec), end; !ec && it != end && inner.size() < 3; it.increment(ec))
      if (fs::is_directory(it->path() / "checkpoints", ec))
        inner.push_back((it->path() / "checkpoints").string());
    std::sort(inner.begin(), inner.end());
    std::string hint;
    for (const auto& i : inner) hint += (hint.empty() ? " (did you mean " : " or ") + i;
    throw lw_error(errc::io_error,
                   path + ": no checkpoint in this directory" + (hint.empty() ? "" : hint + "?)"));
  }
  return {std::move(*c), std::move(*cfg)};
}

std::string checkpoint_label(const runtime::checkpoint& c) {
  auto meta = parse_meta(c.meta);
  if (meta["outer"] == "async")
    return fmt::format("phase {}, theta version {}, inner step {}", c.round, meta["version"], c.step);
  return fmt::format("round {}, inner step {}", c.round, c.step);
}

const runtime::checkpoint_blob& theta_blob(const runtime::checkpoint& c, const std::string& path,
                                           int64_t n_params) {
  const auto* b = c.find("theta");
  if (!b || b->size == 0 || b->size % sizeof(float) != 0)
    throw lw_error(
        errc::corrupt_checkpoint,
        fmt::format("{}: no theta of whole fp32 values in the checkpoint of round {}", path, c.round));
  if (n_params > 0 && b->size != static_cast<size_t>(n_params) * sizeof(float))
    throw lw_error(
        errc::corrupt_checkpoint,
        fmt::format("{}: theta of round {} holds {} values, the model of its config has {} parameters", path,
                    c.round, b->size / sizeof(float), n_params));
  return *b;
}

models::model_spec checkpoint_spec(const config::train_config& cfg, int64_t n_theta,
                                   const std::string& path) {
  // With model.vocab_size 0 the run took its vocabulary from the data: it is read off theta's size (the
  // embedding is the only part that depends on it).
  auto spec = models::spec_of(cfg.model, 0);
  const int64_t without_embedding = models::closed_form_param_count(spec);
  spec.vocab_size = cfg.model.vocab_size;
  if (spec.vocab_size <= 0 && (n_theta - without_embedding) % spec.dim == 0)
    spec.vocab_size = (n_theta - without_embedding) / spec.dim;
  if (spec.vocab_size > 0 && models::closed_form_param_count(spec) != n_theta)
    throw lw_error(
        errc::corrupt_checkpoint,
        fmt::format("{}: theta holds {} values, the model of its stored config ('{}', model.vocab_size "
                    "{}) has {} parameters",
                    path, n_theta, models::model_label(spec), spec.vocab_size,
                    models::closed_form_param_count(spec)));
  if (spec.vocab_size <= 0)
    throw lw_error(errc::corrupt_checkpoint,
                   fmt::format("{}: theta holds {} values, which no vocabulary of model '{}' gives", path,
                               n_theta, models::model_label(spec)));
  return spec;
}

void copy_theta(const runtime::checkpoint& c, const std::string& path, float* out, int64_t n_params) {
  const auto& b = theta_blob(c, path, n_params);
  std::memcpy(out, b.data, b.size);
}

}  // namespace longwave::actors
