// A checkpoint's theta_global, its model and its tokenizer (cli/checkpoint_model.hpp).
#include "cli/checkpoint_model.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "actors/run_files.hpp"
#include "models/data/file_io.hpp"
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
  m.theta.resize(blob.size / sizeof(float));
  actors::copy_theta(named.ckpt, path, m.theta.data(), static_cast<int64_t>(m.theta.size()));
  m.cfg = std::move(named.cfg);
  m.label = actors::checkpoint_label(named.ckpt);
  if (const auto* tok = named.ckpt.find("tokenizer"); tok && tok->size > 0)
    m.tokenizer_text.assign(static_cast<const char*>(tok->data), tok->size);
  return m;
}

std::optional<tokenizer_file> find_tokenizer(const checkpoint_model& m, const std::string& ckpt_path,
                                             const char* who) {
  if (!m.tokenizer_text.empty()) return tokenizer_file{m.tokenizer_text, "the checkpoint"};
  const fs::path ckpt_dir =
      fs::is_directory(ckpt_path) ? fs::path(ckpt_path) : fs::path(ckpt_path).parent_path();
  std::vector<fs::path> candidates{fs::absolute(ckpt_dir).parent_path() / "data" / "tokenizer.txt",
                                   fs::path(actors::resolve_paths(m.cfg).data_dir) / "tokenizer.txt"};
  const bool shards = !m.cfg.data.path.empty() && fs::is_directory(m.cfg.data.path);
  if (shards) candidates.push_back(fs::path(m.cfg.data.path) / "tokenizer.txt");
  // data.tokenizer names the kind only for a corpus run: the default corpus, or a file (where it is now or,
  // archived elsewhere, a name a corpus has). Shards' tokenizer is theirs.
  auto ext = fs::path(m.cfg.data.path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const bool corpus_run =
      m.cfg.data.path.empty() || fs::is_regular_file(m.cfg.data.path) || ext == ".txt" || ext == ".jsonl";
  // A model whose vocabulary came from its tokenizer needs the same size; a corpus run, the same kind.
  const bool exact = m.cfg.model.vocab_size == 0;
  for (const auto& c : candidates) {
    if (!fs::is_regular_file(c)) continue;
    try {
      auto text = models::data::read_file(c.string(), "tokenizer");
      const auto tok = models::data::parse_tokenizer(text, c.string());
      const int64_t vocab = tok->vocab_size();
      const auto kind = config::to_string(m.cfg.data.tokenizer);
      if (corpus_run && tok->kind() != kind)
        spdlog::info("{}: {} is not this model's tokenizer (a {} tokenizer, the run's data.tokenizer is {})",
                     who, c.string(), tok->kind(), kind);
      else if (exact ? vocab == m.spec.vocab_size : vocab <= m.spec.vocab_size)
        return tokenizer_file{std::move(text), c.string()};
      else
        spdlog::info("{}: {} is not this model's tokenizer ({} tokens, the model has {})", who, c.string(),
                     vocab, m.spec.vocab_size);
    } catch (const lw_error& e) {  // not a tokenizer of ours, or a damaged one: the next candidate
      spdlog::info("{}: {} is not a tokenizer it can read ({})", who, c.string(), e.what());
    }
  }
  return std::nullopt;
}

}  // namespace longwave::cli
