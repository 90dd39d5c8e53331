// The commands that need no LibTorch: the `longwave` front binary runs them (cli/commands.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "cli/report/page.hpp"
#include "cli/sweep/point_process.hpp"
#include "cli/sweep/sweep_file.hpp"
#include "cluster/master_role.hpp"
#include "comm/curve.hpp"
#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "config/toml_types.hpp"
#include "models/data/corpus.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/model_spec.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/files/directory.hpp"
#include "runtime/log/log.hpp"
#include "runtime/process/port_check.hpp"
#include "runtime/process/proc_state.hpp"

namespace longwave::cli {

namespace {

void print_preset_row(const std::string& name, const models::model_spec& s) {
  std::printf("%-6s %6ld %7ld %6ld %8ld %6ld %14ld\n", name.c_str(), s.dim, s.n_layers, s.n_heads,
              s.n_kv_heads, s.ffn_hidden, models::closed_form_param_count(s));
}

/// `presets`: the preset table; with a config or shape options, also the parameter count of that shape.
int cmd_presets(int64_t vocab, int64_t seq_len, const std::string& config_path,
                const std::vector<std::string>& shape_overrides) {
  std::optional<models::model_spec> given;
  if (!config_path.empty() || !shape_overrides.empty()) {
    // Through the config loader, so a shape gets the checks and error messages of `run`.
    try {
      // A cluster file's training settings, as its nodes read them.
      bool cluster = false;
      try {
        cluster = !config_path.empty() &&
                  config::parse_toml(config::read_config_text(config_path), config_path).contains("cluster");
      } catch (const std::exception&) {  // the loader below names what is wrong with the file
      }
      const auto cfg = config_path.empty() ? config::parse_config("", shape_overrides, "command line")
                       : cluster           ? config::load_cluster_file(config_path, shape_overrides).train
                                           : config::load_config_file(config_path, shape_overrides);
      if (!config_path.empty()) {
        seq_len = cfg.model.seq_len;
        vocab = models::data::config_vocab(cfg);
      }
      auto m = cfg.model;
      m.seq_len = seq_len;
      given = models::spec_of(m, vocab);
    } catch (const config::config_error& e) {
      // The shape options reach the loader as --set overrides: name the option the user gave.
      std::string msg = e.what();
      const std::string from_set = " (from --set)", key = e.key();
      if (const auto at = msg.find(from_set); at != std::string::npos && key.rfind("model.", 0) == 0) {
        std::string option = key.substr(6);
        std::replace(option.begin(), option.end(), '_', '-');
        msg.replace(at, from_set.size(), " (from --" + option + ")");
      }
      std::fprintf(stderr, "%s\n", msg.c_str());
      return 2;
    }
  }
  std::printf("%-6s %6s %7s %6s %8s %6s %14s\n", "preset", "dim", "layers", "heads", "kv_heads", "ffn",
              "parameters");
  for (const auto& name : models::preset_names())
    print_preset_row(name, models::preset_spec(name, vocab, seq_len));
  if (given) print_preset_row("shape", *given);
  std::printf("(vocab %ld, context %ld; parameters include the tied embedding)\n", vocab, seq_len);
  if (given)
    std::printf("shape: %s, %ld parameters\n", models::model_label(*given).c_str(),
                models::closed_form_param_count(*given));
  return 0;
}

/// `sweep`: checks the sweep file (exit 2 naming the entry), then runs it.
int cmd_sweep(cli_values& v, const char* argv0) {
  sweep::sweep_spec spec;
  try {
    spec = sweep::load_sweep(v.sweep_path, [](const config::train_config& c) {
      return static_cast<double>(
          models::closed_form_param_count(models::spec_of(c.model, models::data::config_vocab(c))));
    });
  } catch (const sweep::sweep_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  v.sweep.exe = self_exe(argv0);
  if (!v.sweep_parallel.empty())
    v.sweep.parallel = v.sweep_parallel == "auto" ? 0 : std::stol(v.sweep_parallel);
  return sweep::run_sweep(spec, v.sweep);
}

/// `keys new`: the key files of a cluster (see add_keys).
int cmd_keys_new(const cli_values& v) {
  runtime::init_logging("info");
  if (v.keys_dir.empty()) {  // [security] keys = "" means unset: such a directory could never be named
    std::fprintf(stderr, "keys new: --out is empty: name the key directory\n");
    return 2;
  }
  std::vector<std::string> names;
  for (const auto& list : v.keys_nodes) {  // split here: "a,,b" must name its empty name, not skip it
    for (size_t from = 0;;) {
      const size_t comma = list.find(',', from);
      names.push_back(list.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
  }
  if (!v.keys_cluster.empty()) {
    // The cluster file may already name this key directory, or not yet: it is read without [security].
    auto spec = load_cluster(v.keys_cluster, {"security.mode=none"});
    if (!spec) return 2;
    for (const auto& n : spec->nodes) names.push_back(n.name);
  }
  if (names.empty()) {
    std::fprintf(stderr, "keys new: name the nodes with --cluster FILE or --nodes a,b,c\n");
    return 2;
  }
  for (const auto& n : names) {
    const bool ok = config::valid_node_name(n);
    if (!ok || config::reserved_node_name(n) || std::count(names.begin(), names.end(), n) > 1) {
      std::fprintf(stderr, "keys new: node name '%s': %s\n", n.c_str(),
                   !ok                             ? "names are 1..32 characters of A-Z a-z 0-9 _ -"
                   : config::reserved_node_name(n) ? "a name launch uses in run.out_dir; no node may have it"
                                                   : "given twice");
      return 2;
    }
  }
  // --cluster after nodes were added to the file: the keyed nodes keep their keys (a new key would lock
  // them out until their machines had it), the others get theirs.
  if (!v.keys_cluster.empty()) {
    std::vector<std::string> unkeyed;
    for (const auto& n : names) {
      std::error_code ec;
      const auto base = std::filesystem::path(v.keys_dir) / "nodes" / n;
      const bool pub = std::filesystem::exists(base.string() + ".public", ec);
      const bool sec = std::filesystem::exists(base.string() + ".secret", ec);
      if (pub && sec)
        std::printf("node %s: keyed already (kept)\n", n.c_str());
      else
        unkeyed.push_back(n);  // half a pair is refused below, naming the file
    }
    if (unkeyed.empty()) {
      try {  // the cluster's public half, when lost, is made again from its secret
        for (const auto& f : comm::make_key_directory(v.keys_dir, {})) std::printf("wrote %s\n", f.c_str());
      } catch (const lw_error& e) {
        std::fprintf(stderr, "keys new: %s\n", e.what());
        return e.code() == errc::invalid_config ? 2 : 1;
      }
      std::printf("every node of %s has its keys in %s: no node key written\n", v.keys_cluster.c_str(),
                  v.keys_dir.c_str());
      return 0;
    }
    names = std::move(unkeyed);
  }
  try {
    const auto written = comm::make_key_directory(v.keys_dir, names);
    for (const auto& f : written) std::printf("wrote %s\n", f.c_str());
    std::printf(
        "keys of %zu node(s) in %s. In the cluster file: [security] keys = \"%s\". Give the coordinator's "
        "machine cluster.secret and nodes/*.public, and node NAME's machine cluster.public and "
        "nodes/NAME.secret (keep secrets private: 0600).\n",
        names.size(), v.keys_dir.c_str(), v.keys_dir.c_str());
    return 0;
  } catch (const lw_error& e) {
    std::fprintf(stderr, "keys new: %s\n", e.what());
    return e.code() == errc::invalid_config ? 2 : 1;
  }
}

/// What is wrong with `data prepare`'s input or --out, before anything is read or written ("": nothing).
std::string prepare_problem(const cli_values& v) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (v.out_dir.empty()) return "--out is empty: name the output directory";
  // One line each, as a run's paths: prepared.txt records them a line a key.
  if (const auto bad = config::one_line_problem(v.out_dir); !bad.empty()) return "--out: " + bad;
  if (const auto bad = config::one_line_problem(v.input); !bad.empty()) return "the corpus: " + bad;
  if (fs::exists(v.out_dir, ec) && !fs::is_directory(v.out_dir, ec))
    return "--out " + v.out_dir + " is not a directory";
  if (!(v.val_fraction > 0.0 && v.val_fraction <= 0.5))  // data.val_fraction's range, so a run can name it
    return fmt::format("--val-fraction {} must be in (0, 0.5], as data.val_fraction", v.val_fraction);
  if (v.input.empty()) {  // the default corpus, as `run` names it when it is missing
    const auto kjv = models::data::default_corpus_path();
    if (fs::is_directory(kjv, ec))  // LONGWAVE_CORPUS names shards: nothing to prepare (it said "done")
      return "the default corpus " + kjv +
             " is a directory: llm.c shards are used as they are (data.path names them), and a corpus is "
             "one text or JSONL file";
    return fs::exists(kjv, ec) ? ""
                               : "the default corpus " + kjv +
                                     " is missing: run scripts/setup (it writes the KJV text) or name a "
                                     "corpus file";
  }
  if (!fs::exists(v.input, ec)) return v.input + ": no such file";
  if (fs::is_directory(v.input, ec))
    return v.input +
           " is a directory: llm.c shards are used as they are (data.path names them), and a corpus "
           "is one text or JSONL file";
  if (!fs::is_regular_file(v.input, ec)) return v.input + " is not a regular file";
  return "";
}

int cmd_prepare(const cli_values& v) {
  if (const auto problem = prepare_problem(v); !problem.empty()) {
    spdlog::error("data prepare: {}", problem);
    return 2;
  }
  // As run and export say of their folders (it was exit 1, "cannot create 'dangling': File exists").
  // Made here only if this call created it (not one another process made meanwhile).
  const auto parent = std::filesystem::path(v.out_dir).parent_path();
  std::error_code ec;
  const bool made = (parent.empty() || runtime::make_directories(parent.string()).empty()) &&
                    std::filesystem::create_directory(v.out_dir, ec);
  if (const auto problem = runtime::make_directories(v.out_dir); !problem.empty()) {
    spdlog::error("data prepare: --out {}: {}", v.out_dir, problem);
    return 2;
  }
  // A folder this preparation made holds nothing of use when it fails (a probe found it with its lock file).
  const auto drop = [&] {
    if (made) models::data::remove_unless_preparing(v.out_dir);
  };
  try {
    auto d = models::data::prepare_dataset(v.input.empty() ? models::data::default_corpus_path() : v.input,
                                           *config::from_string<config::tokenizer_kind>(v.tokenizer), v.vocab,
                                           v.val_fraction, v.out_dir,
                                           [](const std::string& l) { spdlog::info("{}", l); });
    std::printf("train: %s (%ld tokens)\nval: %s (%ld tokens)\ntokenizer: %s (vocab %ld)\n",
                d.train_path.c_str(), d.n_train_tokens, d.val_path.c_str(), d.n_val_tokens,
                d.tokenizer_path.c_str(), d.vocab_size);
    return 0;
  } catch (const lw_error& e) {
    spdlog::error("{}", e.what());
    drop();
    // corrupt_data: the input is empty, binary or malformed, a bad argument (as in `run`).
    return e.code() == errc::invalid_config || e.code() == errc::corrupt_data ? 2 : 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", describe(e));
    drop();
    return 1;
  }
}

}  // namespace

/// Loads a cluster file for a role; prints the config error and returns nullopt.
std::optional<config::cluster_spec> load_cluster(const std::string& path, const std::vector<std::string>& ov,
                                                 bool warn) {
  try {
    std::vector<std::string> warnings;
    auto spec = config::load_cluster_file(path, ov, &warnings);
    if (warn)
      for (const auto& w : warnings) spdlog::warn("{}", w);
    return spec;
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return std::nullopt;
  }
}

std::optional<config::train_config> load_run_config(const cli_values& v, std::vector<std::string>* warnings) {
  try {
    return config::load_config_file(v.config_path, v.overrides, warnings);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return std::nullopt;
  }
}

namespace {

/// The PIDs of the processes of this cluster on this machine that hold a lock in its out_dir: each node's,
/// and a `longwave launch`'s (its logs folder, which a relaunch takes). `stop --wait` notes them before it
/// asks the coordinator.
std::vector<std::pair<std::string, pid_t>> local_role_pids(const config::cluster_spec& spec) {
  std::vector<std::pair<std::string, pid_t>> out;
  const std::filesystem::path run_dir = spec.train.run.out_dir;
  auto add = [&](const std::string& what, const std::filesystem::path& dir) {
    if (const auto pid = sweep::folder_in_use(dir.string()); !pid.empty() && std::atoi(pid.c_str()) > 0)
      out.emplace_back(what, static_cast<pid_t>(std::atoi(pid.c_str())));
  };
  for (const auto& n : spec.nodes) add("node " + n.name, run_dir / n.name);
  add("longwave launch", run_dir / "logs");
  return out;
}

/// `stop --wait`, once the coordinator said the run ended: the roles exit moments later, holding their locks
/// and ports until then, so a relaunch at once could find them taken. Waits (up to a minute) until the
/// processes that ran here (nodes, a launch) have exited and the coordinator's ports here are free.
int wait_roles_gone(const config::cluster_spec& spec,
                    const std::vector<std::pair<std::string, pid_t>>& roles) {
  std::vector<std::pair<std::string, int>> ports;
  for (const auto& endpoint : spec.coordinators) {  // tcp://HOST:PORT
    const auto colon = endpoint.rfind(':');
    const auto from = endpoint.find("://");
    if (colon != std::string::npos && from != std::string::npos && colon > from)
      ports.emplace_back(endpoint.substr(from + 3, colon - from - 3),
                         std::atoi(endpoint.c_str() + colon + 1));
  }
  if (spec.train.metrics.enabled && config::coordinator_metrics_port(spec) > 0)
    ports.emplace_back(spec.train.metrics.address, static_cast<int>(config::coordinator_metrics_port(spec)));
  const auto busy = [&] {
    std::vector<std::string> left;
    for (const auto& [what, pid] : roles)
      if (!runtime::has_exited(pid)) left.push_back(fmt::format("{} (pid {})", what, pid));
    for (const auto& [host, port] : ports)  // another machine's address is not in use here
      if (port > 0 && runtime::bind_error(host, port) == EADDRINUSE)
        left.push_back(fmt::format("the coordinator's port {}:{}", host, port));
    return left;
  };
  const auto t0 = std::chrono::steady_clock::now();
  bool said = false;
  for (auto left = busy(); !left.empty(); left = busy()) {
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (waited > std::chrono::minutes(1)) {
      spdlog::error("stop: still running a minute after the run ended: {}", fmt::join(left, ", "));
      return 1;
    }
    if (!said && waited > std::chrono::seconds(2)) {
      spdlog::info("stop: waiting for the roles on this machine to exit: {}", fmt::join(left, ", "));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

}  // namespace

std::optional<int> run_tool(const subcommands& sub, cli_values& v, const char* argv0) {
  if (sub.coord->parsed()) {
    runtime::init_logging(v.log_level);
    // The coordinator says what in the file is likely a mistake: one process per cluster.
    auto spec = load_cluster(v.cluster_path, v.cluster_overrides, /*warn=*/true);
    return spec ? cluster::run_master_role(*spec, v.coordinator_bind) : 2;
  }
  if (sub.stop->parsed()) {
    runtime::init_logging("info");
    auto spec = load_cluster(v.cluster_path, v.cluster_overrides);
    if (!spec) return 2;
    const auto roles = v.stop_wait ? local_role_pids(*spec) : std::vector<std::pair<std::string, pid_t>>{};
    const int code = cluster::request_cluster_stop(*spec, v.stop_wait);
    return code == 0 && v.stop_wait ? wait_roles_gone(*spec, roles) : code;
  }
  if (sub.launch->parsed())
    return launch(self_exe(argv0), v.cluster_path, v.cluster_overrides, v.cluster_fresh, v.observe);
  if (sub.report->parsed()) {
    runtime::init_logging("info");
    return report::write(v.report_dir, v.report_out);
  }
  if (sub.prep->parsed()) return cmd_prepare(v);
  if (sub.presets->parsed()) return cmd_presets(v.pv, v.pt, v.presets_config, v.shape_overrides);
  if (sub.keys_new->parsed()) return cmd_keys_new(v);
  if (sub.sweep->parsed()) return cmd_sweep(v, argv0);
  return std::nullopt;
}

}  // namespace longwave::cli
