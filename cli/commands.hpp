#pragma once
// `longwave`'s command line, defined once and parsed by two binaries. `longwave` (cli/main.cpp) links no
// LibTorch: it runs the commands that need no model (coordinator, stop, launch, report, presets, keys,
// sweep, data prepare) and starts in milliseconds. The commands that train or read a model's tensors
// (run, eval, export, sample, node, and --version) it hands to `longwave-torch` beside it
// (cli/torch_main.cpp) by exec: same process, same arguments. Loading Debian's LibTorch costs about 1 CPU
// second per process.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/export.hpp"
#include "cli/launch.hpp"
#include "cli/sample.hpp"
#include "cli/sweep/runner.hpp"
#include "config/cluster_config.hpp"

namespace longwave::cli {

/// What the command line fills in; the subcommands' options point into it.
struct cli_values {
  // run (log_level also for coordinator and node)
  std::string config_path;
  std::vector<std::string> overrides;
  bool run_dry_run = false, run_fresh = false;
  std::string log_level = "info";
  // eval
  std::string ckpt;
  int64_t batches = 0;
  std::string eval_data;  // eval --data
  // export
  export_options exp;
  sample_options sample;
  // data prepare
  std::string input, out_dir, tokenizer = "byte";
  int64_t vocab = 1024;
  double val_fraction = 0.05;
  // coordinator, node, launch
  std::string cluster_path, node_name;
  std::vector<std::string> cluster_overrides;
  bool cluster_fresh = false, node_dry_run = false, node_leave = false, stop_wait = false;
  std::string coordinator_bind;  // coordinator --bind
  std::string node_endpoint;     // node --endpoint, --workers: a node not in the cluster file
  int64_t node_workers = -1;     // not given
  observe_options observe;
  // report
  std::string report_dir, report_out;
  // presets: --vocab, --seq-len, a config and the shape options as model.* overrides
  int64_t pv = 256, pt = 128;
  std::string presets_config;
  std::vector<std::string> shape_overrides;
  // keys new
  std::string keys_dir, keys_cluster;
  std::vector<std::string> keys_nodes;
  // sweep
  std::string sweep_path, sweep_parallel;
  sweep::sweep_options sweep;
};

/// The subcommands, to tell which one was given.
struct subcommands {
  CLI::App *run, *eval, *exp, *sample, *prep, *coord, *node, *stop, *launch, *report, *presets, *keys_new,
      *sweep;
  /// Whether the command parsed writes its product to stdout (a loss, text, a table), so that a failed write
  /// there fails it; the others write files, and only log lines to stdout.
  bool stdout_is_product() const { return eval->parsed() || sample->parsed() || presets->parsed(); }
  /// Whether a failed write to stdout fails the command: its product, or a dry run's resolved config or plan.
  bool stdout_checked(const cli_values& v) const {
    return stdout_is_product() || (run->parsed() && v.run_dry_run) || (node->parsed() && v.node_dry_run) ||
           (sweep->parsed() && v.sweep.dry_run);
  }
};

/// Defines the app's description, --version (its text from `version`) and every subcommand, in --help's
/// order.
subcommands add_commands(CLI::App& app, cli_values& v, std::function<std::string()> version);

/// Parses argv into `app`. Returns the exit code when parsing ends the process (--help: 0; an unknown
/// command or a bad option: 2, with CLI11's message), else nullopt.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

/// For a command whose product is its stdout (eval, sample, presets): a closed stdout fails it before any
/// work (exit 1, one line on stderr), else its information lines go to stderr beside the warnings.
std::optional<int> keep_stdout_for_product(const subcommands& sub);

/// Runs the command that was given when it needs no LibTorch; nullopt when it does (run, eval, export,
/// sample, node).
std::optional<int> run_tool(const subcommands& sub, cli_values& v, const char* argv0);

/// Loads `run`'s config with its --set overrides; prints the config error and returns nullopt.
std::optional<config::train_config> load_run_config(const cli_values& v, std::vector<std::string>* warnings);

/// Loads a cluster file for a role; prints the config error and returns nullopt. With `warn`, logs what the
/// file sets that is likely a mistake (config::cluster_warnings).
std::optional<config::cluster_spec> load_cluster(const std::string& path, const std::vector<std::string>& ov,
                                                 bool warn = false);

/// This process's executable (/proc/self/exe), else argv0.
std::string self_exe(const char* argv0);

}  // namespace longwave::cli
