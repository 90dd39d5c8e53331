// Which settings apply only under another: one table, read top to bottom.
#include "config/inert_settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "config/toml_types.hpp"

namespace longwave::config {

namespace {

/// A key (or every key of a section, "async.") that applies only when `applies` holds; `needs` says when.
struct condition {
  std::string_view key;
  bool (*applies)(const train_config&);
  std::string (*needs)(const train_config&);
};

bool diloco_mode(const train_config& c) {
  return c.run.mode == run_mode::diloco;
}
bool streaming(const train_config& c) {
  return c.diloco.outer == outer_policy_kind::streaming;
}
bool async(const train_config& c) {
  return c.diloco.outer == outer_policy_kind::async;
}
bool cgad(const train_config& c) {
  return async(c) && c.async.age_scaling == age_scaling_kind::cgad;
}
bool adaptive(const train_config& c) {
  return c.diloco.adaptive_steps;
}
/// Ready shards (a directory as data.path) keep their own tokenizer and split.
bool corpus_file(const train_config& c) {
  std::error_code ec;
  return c.data.path.empty() || !std::filesystem::is_directory(c.data.path, ec);
}
bool bpe(const train_config& c) {
  return c.data.tokenizer == tokenizer_kind::bpe;
}

std::string outer_is(const train_config& c, const char* wanted) {
  return fmt::format("diloco.outer = \"{}\" (this run's is \"{}\")", wanted, to_string(c.diloco.outer));
}
std::string needs_diloco_mode(const train_config& c) {
  return fmt::format("run.mode = \"diloco\" (this run's is \"{}\")", to_string(c.run.mode));
}
std::string needs_streaming(const train_config& c) {
  return outer_is(c, "streaming");
}
std::string needs_async(const train_config& c) {
  return outer_is(c, "async");
}
std::string needs_cgad(const train_config& c) {
  return async(c) ? fmt::format("async.age_scaling = \"cgad\" (this run's is \"{}\")",
                                to_string(c.async.age_scaling))
                  : needs_async(c) + " with async.age_scaling = \"cgad\"";
}
std::string needs_adaptive(const train_config&) {
  return "diloco.adaptive_steps = true";
}
std::string needs_corpus_file(const train_config& c) {
  return fmt::format(
      "a corpus file as data.path (this run's \"{}\" is a directory of ready shards, which keep their own "
      "vocabulary and split)",
      c.data.path);
}
std::string needs_bpe(const train_config& c) {
  return fmt::format("data.tokenizer = \"bpe\" (this run's is \"{}\")", to_string(c.data.tokenizer));
}

// A key is named by the first rule it fails, so the broader rule comes first: single and ddp have no outer
// step. A rule without a test exempts its key: the loader refuses diloco.outer and adaptive_steps other than
// off outside run.mode = "diloco" (and [federated] outside sync DiLoCo), so a config may have to set them.
constexpr condition conditions[] = {
    {"diloco.outer", nullptr, nullptr},
    {"diloco.adaptive_steps", nullptr, nullptr},
    {"outer.", diloco_mode, needs_diloco_mode},
    {"diloco.", diloco_mode, needs_diloco_mode},
    {"async.", diloco_mode, needs_diloco_mode},
    {"diloco.fragments", streaming, needs_streaming},
    {"diloco.fragment_pattern", streaming, needs_streaming},
    {"diloco.tau", streaming, needs_streaming},
    {"diloco.alpha", streaming, needs_streaming},
    {"diloco.min_steps", adaptive, needs_adaptive},
    {"async.cgad_alpha", cgad, needs_cgad},
    {"async.cgad_cutoff", cgad, needs_cgad},
    {"async.", async, needs_async},
    {"data.bpe_vocab_size", corpus_file, needs_corpus_file},
    {"data.val_fraction", corpus_file, needs_corpus_file},
    {"data.bpe_vocab_size", bpe, needs_bpe},
};

}  // namespace

std::set<std::string> keys_set(std::string_view toml_text, const std::vector<std::string>& overrides) {
  std::set<std::string> keys;
  for (const auto& [section, node] : parse_toml(toml_text))
    if (const auto* t = node.as_table())
      for (const auto& [key, value] : *t)
        keys.insert(std::string(section.str()) + "." + std::string(key.str()));
  for (const auto& o : overrides) {
    std::string key = o.substr(0, o.find('='));
    key.erase(key.find_last_not_of(" \t") + 1);
    keys.insert(key.substr(std::min(key.size(), key.find_first_not_of(" \t"))));
  }
  return keys;
}

std::vector<inert_setting> inert_keys(const train_config& cfg, const std::set<std::string>& set) {
  std::vector<inert_setting> out;
  for (const auto& key : set)
    for (const auto& c : conditions) {
      const bool section = c.key.back() == '.';
      if (section ? key.rfind(c.key, 0) != 0 : key != c.key) continue;
      if (!c.applies) break;
      if (!c.applies(cfg)) {
        out.push_back({key, fmt::format("{} is set, but it applies only with {}: it has no effect", key,
                                        c.needs(cfg))});
        break;
      }
    }
  return out;
}

std::vector<std::string> inert_settings(const train_config& cfg, const std::set<std::string>& set) {
  std::vector<std::string> lines;
  for (auto& i : inert_keys(cfg, set)) lines.push_back(std::move(i.line));
  return lines;
}

}  // namespace longwave::config
