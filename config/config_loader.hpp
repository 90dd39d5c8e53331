#pragma once
// TOML config loader: TOML text + `--set section.key=value` overrides -> a validated train_config, and the
// resolved config back to TOML. Every failure is one config_error with a one-line message naming the key.
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::config {

/// Raised for any invalid config. what() is ONE line, "config error: " followed by message(), which names the
/// key and what is allowed, e.g. "config error: train.workers = -3: must be an integer >= 1".
class config_error : public std::runtime_error {
 public:
  /// `key` is the dotted key at fault ("train.workers"), or "syntax", "file", "override"; `message` should
  /// name it too. Newlines in `message` are replaced by spaces so what() stays one line.
  config_error(std::string key, const std::string& message);

  /// The dotted key at fault, e.g. "train.workers"; "syntax" for TOML syntax errors, "file" for I/O errors.
  const std::string& key() const noexcept { return key_; }
  /// what() without the "config error: " prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  std::string key_;
  std::string message_;
};

/// Parses TOML text, applies `overrides` in order (each "section.key=value"; the value is parsed as a TOML
/// value, and if it does not parse it is taken as a bare string; string fields always accept the raw text),
/// then validates. `source_name` (e.g. the file path) is used in messages. Missing fields keep the struct
/// defaults. Top-level keys named in foreign_sections belong to another reader (the [cluster] and [[nodes]]
/// of a cluster file) and are skipped. Without check_paths, the directories it names are not looked at (a
/// checkpoint's stored config: its run's directories may be gone or elsewhere now). Throws config_error and
/// nothing else.
train_config parse_config(std::string_view toml_text, const std::vector<std::string>& overrides,
                          std::string_view source_name, const std::vector<std::string>& foreign_sections = {},
                          bool check_paths = true);

/// The default run.name for a config at `path`: its file name's stem, each byte of it outside ASCII replaced
/// by '_' when the stem is not UTF-8 (the name goes into TOML copies, which must be).
std::string run_name_of_file(const std::string& path);

/// The key of a --set override "section.key=value" (all of it without '='), blanks trimmed.
std::string override_key(std::string_view override_text);

/// The text of a config file; config_error with key "file" if it cannot be read.
std::string read_config_text(const std::string& path);

/// The checks of a run in one process that a cluster's train section does not take (its workers are the
/// nodes'): federated.clients_per_round within train.workers. Throws config_error.
void check_one_process(const train_config& cfg);

/// Reads the file (config_error with key "file" if it cannot be read), then parse_config and
/// check_one_process. An empty run.name
/// defaults to the file's stem. If `warnings` is given, one line is appended for each thing that is valid but
/// likely a mistake (a file that sets nothing, a setting that the others leave without effect:
/// inert_settings.hpp). Throws config_error and nothing else.
train_config load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* warnings = nullptr);

/// Range, enum and cross-field checks on a filled struct, and that run.out_dir, checkpoint.dir and
/// data.cache_dir do not name an existing file; throws config_error naming the first bad key. Called by
/// parse_config.
void validate(const train_config& cfg);

/// What is wrong with a train.device value, "" when nothing: "cpu", "cuda", "cuda:N" or "auto" are allowed.
std::string device_problem(const std::string& device);

/// "" when `path` is one line of printable characters; else what is in it, e.g. "the path contains a line
/// break (byte 0x0a at 2); a path is one line of printable characters" (`what`: "path").
std::string one_line_problem(const std::string& path, const char* what = "path");

/// The config as TOML text: every section and every field, in struct order, doubles in shortest round-trip
/// form. For a valid config, parse_config(to_toml(c), {}, "") gives back c exactly.
std::string to_toml(const train_config& cfg);

/// The first line of every to_toml text: what tells a run's own resolved copy from a user's config file.
inline constexpr std::string_view resolved_config_header =
    "# Longwave resolved config: every field, defaults included.\n";

}  // namespace longwave::config
