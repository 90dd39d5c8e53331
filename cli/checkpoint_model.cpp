// A checkpoint's theta_global, its model and its tokenizer (cli/checkpoint_model.hpp).
#include "cli/checkpoint_model.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "actors/run_files.hpp"
#include "models/data/tokenizer.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/log/log.hpp"

namespace fs = std::filesystem;

namespace longwave::cli {

checkpoint_model load_checkpoint_model(const std::string& path) {
  auto named = actors::load_named_checkpoint(path);
  const auto& blob = actors::theta_blob(named.ckpt, path);
  checkpoint_model m;
  m.spec = actors::checkpoint_spec(named.cfg, static_cast<int64_t>(blob.size / sizeof(float)), path);
  const auto meta = runtime::parse_meta(named.ckpt.meta);
  if (const auto it = meta.find("preset"); it != meta.end() && it->second != models::model_label(m.spec))
    throw lw_error(errc::corrupt_checkpoint, fmt::format("{}: meta names model '{}', its config gives '{}'",
                                                         path, it->second, models::model_label(m.spec)));
  m.theta.resize(blob.size / sizeof(float));
  actors::copy_theta(named.ckpt, path, m.theta.data(), static_cast<int64_t>(m.theta.size()));
  m.cfg = std::move(named.cfg);
  m.label = actors::checkpoint_label(named.ckpt);
  return m;
}

// A model whose vocabulary came from its tokenizer needs the same size.
std::optional<std::string> find_tokenizer(const checkpoint_model& m, const std::string& ckpt_path,
                                          const char* who) {
  const fs::path ckpt_dir =
      fs::is_directory(ckpt_path) ? fs::path(ckpt_path) : fs::path(ckpt_path).parent_path();
  std::vector<fs::path> candidates{fs::absolute(ckpt_dir).parent_path() / "data" / "tokenizer.txt",
                                   fs::path(actors::resolve_paths(m.cfg).data_dir) / "tokenizer.txt"};
  if (!m.cfg.data.path.empty() && fs::is_directory(m.cfg.data.path))
    candidates.push_back(fs::path(m.cfg.data.path) / "tokenizer.txt");
  const bool exact = m.cfg.model.vocab_size == 0;
  for (const auto& c : candidates) {
    if (!fs::is_regular_file(c)) continue;
    try {
      const int64_t vocab = models::data::load_tokenizer(c.string())->vocab_size();
      if (exact ? vocab == m.spec.vocab_size : vocab <= m.spec.vocab_size) return c.string();
      spdlog::info("{}: {} is not this model's tokenizer ({} tokens, the model has {})", who, c.string(),
                   vocab, m.spec.vocab_size);
    } catch (const lw_error& e) {  // not a tokenizer of ours, or a damaged one: the next candidate
      spdlog::info("{}: {} is not a tokenizer it can read ({})", who, c.string(), e.what());
    }
  }
  return std::nullopt;
}

}  // namespace longwave::cli
