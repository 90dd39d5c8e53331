#pragma once
// A sweep file (`longwave sweep SWEEP.toml`): a base config, overrides for every point, a grid and/or a list
// of points over config keys, repeats over seeds, and an optional scaling-law fit. Parsing expands it into
// the points to run and checks every point through the config loader before anything runs.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::cli::sweep {

/// A bad sweep file. what() is one line: the file, the entry at fault and what is wrong, e.g.
/// `s.toml: grid "train.workerz": config error: unknown key 'train.workerz' (did you mean ...)`.
class sweep_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One swept value of a point.
struct setting {
  std::string key;    ///< "diloco.inner_steps"
  std::string value;  ///< as a --set value (TOML: strings quoted), e.g. "20" or "\"tiny\""
  std::string text;   ///< for people and tables: 20, tiny
};

/// One run of the sweep: its place, its settings and the overrides `longwave run` gets.
struct sweep_point {
  size_t index = 0;                    ///< 0-based, in run order
  std::string id;                      ///< its folder under out_dir/points/, stable across invocations
  std::string name;                    ///< its [[points]] entry's name, "" when unnamed
  size_t entry = 0;                    ///< which [[points]] entry it comes from (0 when there are none)
  size_t repeat = 0;                   ///< 0..repeats-1
  uint64_t seed = 0;                   ///< run.seed
  std::vector<setting> settings;       ///< its [[points]] values, then its grid values, in file order
  std::vector<std::string> overrides;  ///< every --set: [sweep] set, settings, seed, out_dir, name, port
  std::string out_dir;                 ///< out_dir/points/<id>
  config::train_config cfg;            ///< the resolved config (validated)
  double params = 0;                   ///< parameter count from the param_counter (0 without one)

  /// "name=ddp diloco.inner_steps=20 model.preset=tiny seed=1" (seed when there are repeats).
  std::string label(bool with_seed) const;
  /// The text of `key` for this point: a swept value, "name", "seed", or the resolved config's value.
  std::string value_of(std::string_view key) const;
  /// Threads the point's run uses: train.workers x train.threads (0 threads counted as 1).
  int64_t thread_need() const;
};

/// [fit]: L(N) = A * N^-alpha + E per group, over model sizes N.
struct fit_spec {
  bool enabled = false;
  std::string size = "params";        ///< "params" (the parameter count) or a swept numeric config key
  std::vector<std::string> group_by;  ///< one fit per distinct combination of these keys' values
  bool group_by_given = false;        ///< else group_by is every swept key outside [model] but the size
  bool tokens = true;                 ///< also L(D) over tokens D for each group and size
};

/// The expanded sweep.
struct sweep_spec {
  std::string path;                 ///< the sweep file
  std::string base;                 ///< the base config, as a path from the current directory
  std::string out_dir;              ///< the sweep's directory
  std::vector<std::string> set;     ///< [sweep] set: overrides for every point
  int64_t parallel = 0;             ///< points at once; 0 = "auto"
  size_t repeats = 1;               ///< seeds per combination
  bool has_repeats = false;         ///< repeats > 1 or seeds given: the seed is part of a point's label
  std::vector<std::string> keys;    ///< swept keys, in order: "name" (named points), point keys, grid keys
  std::vector<sweep_point> points;  ///< in run order: repeat outermost, then [[points]], then the grid
  fit_spec fit;
  std::vector<std::string> warnings;  ///< swept keys that some points' other settings leave without effect
};

/// What decides whether two points train alike: the resolved config but for run.name, run.out_dir and
/// checkpoint.dir, which the sweep derives from the point's id and its out_dir (however that is written), and
/// but for what changes no loss: [checkpoint]'s every_rounds, keep and max_failed_writes, [metrics],
/// [runtime], comm.timeout_s and comm.link_timeout_s, unless the point sweeps them (`swept`).
std::string training_identity(const config::train_config& cfg, const std::vector<setting>& swept = {});

/// The identity of records before 2026-12-07: the resolved config but for the names and directories.
std::string named_identity(const config::train_config& cfg);

/// The parameter count of a resolved config (models::closed_form_param_count in the CLI); lets the sweep
/// plan fits before anything runs.
using param_counter = std::function<double(const config::train_config&)>;

/// Reads and expands a sweep file: every point's config is built with config::parse_config (the base file's
/// text plus the point's overrides), so unknown keys and wrong types get the loader's own messages,
/// prefixed with the entry that set them. Throws sweep_error (one line) and nothing else.
sweep_spec load_sweep(const std::string& path, const param_counter& count = {});

/// load_sweep on text already read; `path` names the file in messages and anchors `base`.
sweep_spec parse_sweep(std::string_view text, const std::string& path, const param_counter& count = {});

}  // namespace longwave::cli::sweep
