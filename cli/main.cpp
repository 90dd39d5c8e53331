// The `longwave` command line: run, eval, export, data prepare, presets, sweep.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "actors/collective_factory.hpp"
#include "actors/training.hpp"
#include "cli/export.hpp"
#include "cli/launch.hpp"
#include "cli/report/page.hpp"
#include "cli/sweep/runner.hpp"
#include "cli/sweep/sweep_file.hpp"
#include "cluster/roles.hpp"
#include "comm/curve.hpp"
#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "models/cpu_kernels.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/gpu_info.hpp"
#include "models/model_spec.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/log/log.hpp"
#include "runtime/memory/allocator.hpp"

using namespace longwave;

namespace {

std::string self_exe(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  return std::string(buf, static_cast<size_t>(n));
}

/// Loads a cluster file for a role; prints the config error and returns nullopt.
std::optional<config::cluster_spec> load_cluster(const std::string& path,
                                                 const std::vector<std::string>& ov) {
  try {
    return config::load_cluster_file(path, ov);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return std::nullopt;
  }
}

void print_preset_row(const std::string& name, const models::model_spec& s) {
  std::printf("%-6s %6ld %7ld %6ld %8ld %6ld %14ld\n", name.c_str(), s.dim, s.n_layers, s.n_heads,
              s.n_kv_heads, s.ffn_hidden, models::closed_form_param_count(s));
}

/// The vocabulary a config's model gets: model.vocab_size, else the tokenizer's (BPE: its target size).
int64_t config_vocab(const config::train_config& cfg) {
  return cfg.model.vocab_size > 0                            ? cfg.model.vocab_size
         : cfg.data.tokenizer == config::tokenizer_kind::bpe ? cfg.data.bpe_vocab_size
                                                             : 256;
}

/// `presets`: the preset table; with a config or shape options, also the parameter count of that shape.
int cmd_presets(int64_t vocab, int64_t seq_len, const std::string& config_path,
                const std::vector<std::string>& shape_overrides) {
  std::optional<models::model_spec> given;
  if (!config_path.empty() || !shape_overrides.empty()) {
    // Through the config loader, so a shape gets the checks and error messages of `run`.
    try {
      const auto cfg = config_path.empty() ? config::parse_config("", shape_overrides, "command line")
                                           : config::load_config_file(config_path, shape_overrides);
      if (!config_path.empty()) {
        seq_len = cfg.model.seq_len;
        vocab = config_vocab(cfg);
      }
      auto m = cfg.model;
      m.seq_len = seq_len;
      given = models::spec_of(m, vocab);
    } catch (const config::config_error& e) {
      std::fprintf(stderr, "%s\n", e.what());
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

/// What the command line fills in; the subcommands' options point into it.
struct cli_values {
  // run (log_level also for coordinator and node)
  std::string config_path;
  std::vector<std::string> overrides;
  actors::run_options ropts;
  std::string log_level = "info";
  // eval
  std::string ckpt;
  int64_t batches = 0;
  // export
  cli::export_options exp;
  // data prepare
  std::string input, out_dir, tokenizer = "byte";
  int64_t vocab = 1024;
  double val_fraction = 0.05;
  // coordinator, node, launch
  std::string cluster_path, node_name;
  std::vector<std::string> cluster_overrides;
  bool cluster_fresh = false, node_dry_run = false, node_leave = false;
  std::string coordinator_bind;  // coordinator --bind
  std::string node_endpoint;     // node --endpoint, --workers: a node not in the cluster file
  int64_t node_workers = 1;
  cli::observe_options observe;
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
  cli::sweep::sweep_options sweep;
};

/// The subcommands, to tell which one was given.
struct subcommands {
  CLI::App *run, *eval, *exp, *prep, *coord, *node, *stop, *launch, *report, *presets, *keys_new, *sweep;
};

CLI::App* add_run(CLI::App& app, cli_values& v) {
  auto* run = app.add_subcommand("run", "Train from a TOML config (resumes from the latest checkpoint)");
  run->add_option("config", v.config_path, "TOML config file (see examples/)")->required();
  run->add_option("--set", v.overrides, "Override a field: --set section.key=value (repeatable)");
  run->add_flag("--dry-run", v.ropts.dry_run,
                "Validate, print the resolved config, parameter count and memory estimate; do not train");
  run->add_flag("--fresh", v.ropts.fresh, "Start over: delete this run's checkpoints and loss trace first");
  run->add_option("--log-level", v.log_level, "trace, debug, info, warn or error")->capture_default_str();
  run->footer(
      "Progress lines show round, step, loss, tokens/s and ETA; the run ends with the validation "
      "perplexity.\n"
      "Ctrl-C saves a checkpoint and exits with code 130; the same command then resumes exactly.\n"
      "Files in run.out_dir: config.toml, loss_trace.tsv, checkpoints/, data/ (token shards).");
  return run;
}

CLI::App* add_eval(CLI::App& app, cli_values& v) {
  auto* eval = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint's theta_global");
  eval->add_option("checkpoint", v.ckpt, "A .lwc checkpoint file or a checkpoint directory (newest valid)")
      ->required();
  eval->add_option("--batches", v.batches, "Validation batches (default: the run's eval.batches)");
  return eval;
}

CLI::App* add_export(CLI::App& app, cli_values& v) {
  auto* exp = app.add_subcommand(
      "export",
      "Write a checkpoint's theta_global as Hugging Face Llama weights (safetensors + config.json)");
  exp->add_option("checkpoint", v.exp.checkpoint,
                  "A .lwc checkpoint file or a checkpoint directory (newest valid), as for eval")
      ->required();
  exp->add_option("--format", v.exp.format, "Output format: safetensors")->capture_default_str();
  exp->add_option("--out", v.exp.out_dir, "Output directory (made if missing)")->required();
  exp->add_flag("--force", v.exp.force, "Overwrite the files of an earlier export in a non-empty --out");
  // Diagnostics for checking an export against another implementation (the export test); not in --help.
  exp->add_option("--logits-for", v.exp.logits_for, "")->group("");
  exp->add_option("--logits-out", v.exp.logits_out, "")->group("");
  exp->footer(
      "Writes DIR/model.safetensors (fp32, LlamaForCausalLM names: model.embed_tokens.weight,\n"
      "model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.mlp.{gate,up,down}_proj.weight, the\n"
      "norms, model.norm.weight; the output head is tied to the embedding), DIR/config.json (Llama\n"
      "config: shape, rope_theta, rms_norm_eps, tie_word_embeddings) and, when the run has one, its\n"
      "tokenizer.txt (Longwave's format). q_proj and k_proj rows are reordered for Llama's rotate-half "
      "RoPE,\n"
      "so Llama's forward pass computes our logits. A non-empty DIR is refused unless --force.");
  return exp;
}

/// `data prepare`; returns the prepare subcommand.
CLI::App* add_data_prepare(CLI::App& app, cli_values& v) {
  auto* data = app.add_subcommand("data", "Data tools");
  auto* prep =
      data->add_subcommand("prepare", "Tokenize a corpus into llm.c .bin shards (train.bin, val.bin)");
  data->require_subcommand(1);
  prep->add_option("input", v.input, "Text file, JSONL file (field \"text\"), or '' for the bundled KJV");
  prep->add_option("--out", v.out_dir, "Output directory")->required();
  const auto& tokenizer_names = config::enum_names<config::tokenizer_kind>::names;
  prep->add_option("--tokenizer", v.tokenizer, "byte or bpe")
      ->check(CLI::IsMember(std::vector<std::string>(tokenizer_names.begin(), tokenizer_names.end())))
      ->capture_default_str();
  prep->add_option("--vocab", v.vocab, "BPE vocabulary size")->capture_default_str();
  prep->add_option("--val-fraction", v.val_fraction, "Share of tokens held out for validation")
      ->capture_default_str();
  return prep;
}

const char* const cluster_footer =
    "A cluster file is a training config plus [cluster] (id, coordinator, join_timeout_s,\n"
    "heartbeat_timeout_s, min_nodes, quorum_timeout_s, open, open_workers) and one [[nodes]] entry per\n"
    "node (name, endpoint, workers, metrics_port). A node that dies or leaves is removed and the others\n"
    "go on; started again with the same command, it rejoins the running cluster with the members' state.\n"
    "See examples/cluster_4nodes.toml. Each node writes to <run.out_dir>/<node name>.";

CLI::App* add_coordinator(CLI::App& app, cli_values& v) {
  auto* coord = app.add_subcommand("coordinator",
                                   "Cluster role: admit the nodes, give them ring positions, watch them");
  coord->add_option("cluster", v.cluster_path, "Cluster TOML file")->required();
  coord->add_option("--set", v.cluster_overrides, "Override a field: --set section.key=value (repeatable)");
  coord->add_option("--bind", v.coordinator_bind,
                    "Which of [cluster] coordinator's addresses to listen on (default: the first); a standby "
                    "coordinator started elsewhere takes the running cluster over");
  coord->add_option("--log-level", v.log_level, "trace, debug, info, warn or error")->capture_default_str();
  coord->footer(cluster_footer);
  return coord;
}

CLI::App* add_node(CLI::App& app, cli_values& v) {
  auto* node = app.add_subcommand("node", "Cluster role: join the coordinator as one node and train");
  node->add_option("cluster", v.cluster_path, "Cluster TOML file")->required();
  node->add_option("--node", v.node_name,
                   "This node's name in the cluster file (or, when [cluster] open = true, a new name with "
                   "--endpoint and --workers)")
      ->required();
  node->add_option(
      "--endpoint", v.node_endpoint,
      "A node not in the cluster file: its ring endpoint, tcp://HOST:PORT (joins a running cluster "
      "whose [cluster] open = true)");
  node->add_option("--workers", v.node_workers, "A node not in the cluster file: its workers")
      ->capture_default_str();
  node->add_option("--set", v.cluster_overrides, "Override a field: --set section.key=value (repeatable)");
  node->add_flag("--fresh", v.cluster_fresh,
                 "Start over: delete this node's checkpoints and loss trace first");
  node->add_flag("--dry-run", v.node_dry_run, "Validate and print this node's resolved config; do not join");
  node->add_flag("--leave", v.node_leave,
                 "Ask the running node NAME to leave the cluster at its next round boundary (it saves its "
                 "checkpoint and exits 0; the others go on), then exit");
  node->add_option("--log-level", v.log_level, "trace, debug, info, warn or error")->capture_default_str();
  node->footer(cluster_footer);
  return node;
}

CLI::App* add_stop(CLI::App& app, cli_values& v) {
  auto* stop = app.add_subcommand(
      "stop", "Stop a running cluster: every node finishes its current round, saves its checkpoint, exits 0");
  stop->add_option("cluster", v.cluster_path, "Cluster TOML file")->required();
  stop->add_option("--set", v.cluster_overrides, "Override a field: --set section.key=value (repeatable)");
  stop->footer(
      "The coordinator asks every node where it can stop and tells all of them the same round, so their\n"
      "checkpoints agree; then it exits 0 too. The same `coordinator` and `node` commands resume the run.\n"
      "With CURVE this needs the cluster's own key pair (keys/cluster.secret, as the coordinator's machine\n"
      "has it). Returns once the coordinator answered: exit 0 when it stops, 1 when it cannot be reached,\n"
      "2 for a refused key. To stop one node only: longwave node CLUSTER.toml --node NAME --leave.");
  return stop;
}

CLI::App* add_launch(CLI::App& app, cli_values& v) {
  auto* launch = app.add_subcommand(
      "launch",
      "Start the coordinator and every node of a cluster file as local processes (Ctrl-C stops all)");
  launch->add_option("cluster", v.cluster_path, "Cluster TOML file")->required();
  launch->add_option("--set", v.cluster_overrides, "Override a field for every role (repeatable)");
  launch->add_flag("--fresh", v.cluster_fresh, "Every node starts over (deletes its checkpoints first)");
  launch->add_flag("--observe", v.observe.enabled,
                   "Also start Debian's Prometheus server scraping every role (data in RUN_DIR/prometheus)");
  launch->add_option("--observe-port", v.observe.port, "Port of Prometheus on 127.0.0.1")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  launch
      ->add_option("--scrape-interval", v.observe.scrape_interval, "Prometheus scrape interval, e.g. 1s, 15s")
      ->check([](const std::string& s) {
        const bool ok = s.size() >= 2 && s.find_first_not_of("0123456789") == s.size() - 1 &&
                        std::string("smh").find(s.back()) != std::string::npos && s[0] != '0';
        return ok ? std::string() : std::string("a Prometheus duration such as 1s, 15s or 1m");
      })
      ->capture_default_str();
  launch->footer(
      "Output lines are prefixed with [coordinator] or [node name]. The exit code is 0 when every role\n"
      "succeeded, 130 after Ctrl-C, else the first failing role's code. With --observe, the Prometheus UI\n"
      "is at http://127.0.0.1:<observe-port>; import the dashboards from dashboards/ into Grafana.");
  return launch;
}

CLI::App* add_report(CLI::App& app, cli_values& v) {
  auto* report = app.add_subcommand(
      "report", "Write one self-contained HTML report (inline SVG charts) of a run from its metrics.jsonl");
  report->add_option("run_dir", v.report_dir, "The run's out_dir (a cluster's out_dir: one series per node)")
      ->required();
  report->add_option("--out", v.report_out, "Output file (default: RUN_DIR/report.html)");
  return report;
}

CLI::App* add_presets(CLI::App& app, cli_values& v) {
  auto* presets = app.add_subcommand("presets", "List the model presets and their parameter counts");
  presets->add_option("--vocab", v.pv, "Vocabulary size")->capture_default_str();
  presets->add_option("--seq-len", v.pt, "Context length")->capture_default_str();
  presets->add_option("--config", v.presets_config,
                      "Also count the parameters of this config's model (its vocab and context too)");
  // Each shape option becomes a model.<key> override, checked as in `run`.
  for (const char* key : {"preset", "dim", "layers", "heads", "kv_heads", "ffn_hidden"}) {
    std::string flag = std::string("--") + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    presets->add_option_function<std::string>(
        flag,
        [&v, key](const std::string& x) {
          v.shape_overrides.push_back(std::string("model.") + key + "=" + x);
        },
        std::string("Also count the parameters of this shape: model.") + key);
  }
  presets->footer(
      "e.g. longwave presets --dim 256 --layers 4 --heads 4 (other keys: the preset's, tiny by default)");
  return presets;
}

CLI::App* add_keys(CLI::App& app, cli_values& v) {
  auto* keys =
      app.add_subcommand("keys", "CURVE keys that authenticate a cluster's nodes and encrypt its links");
  keys->require_subcommand(1);
  auto* make = keys->add_subcommand(
      "new", "Make the cluster's key pair (the coordinator's) and one key pair per node in a key directory");
  make->add_option("--out", v.keys_dir, "Key directory (made if missing; [security] keys names it)")
      ->required();
  make->add_option("--cluster", v.keys_cluster, "A key pair for every node of this cluster file");
  make->add_option("--nodes", v.keys_nodes, "A key pair for each of these node names (comma-separated)")
      ->delimiter(',');
  make->footer(
      "Writes DIR/cluster.{public,secret} (unless DIR already has them) and DIR/nodes/NAME.{public,secret},\n"
      "every file mode 0600; an existing node key is never overwritten (exit 2). The coordinator needs\n"
      "cluster.secret and nodes/*.public; node NAME needs cluster.public and nodes/NAME.secret. A key can "
      "be\n"
      "revoked with [security] revoked = [\"NAME\"] in the coordinator's cluster file.");
  return make;
}

CLI::App* add_sweep(CLI::App& app, cli_values& v) {
  auto* sweep = app.add_subcommand(
      "sweep",
      "Run a grid or list of configs over seeds (resumable); results table, HTML page, scaling fits");
  sweep->add_option("sweep_file", v.sweep_path, "Sweep TOML file (see examples/sweeps/)")->required();
  sweep->add_flag("--dry-run", v.sweep.dry_run, "Check every point and print the plan; run nothing");
  sweep->add_flag(
      "--fresh", v.sweep.fresh,
      "Start every point over (longwave run --fresh), ignoring what earlier invocations finished");
  sweep->add_flag("--results-only", v.sweep.results_only,
                  "Rewrite results, page and fits from the points finished so far; run nothing");
  sweep
      ->add_option("--parallel", v.sweep_parallel,
                   "Points at once: auto or a number (overrides [sweep] parallel)")
      ->check([](const std::string& s) {
        char* end = nullptr;
        const long n = std::strtol(s.c_str(), &end, 10);
        return s == "auto" || (!s.empty() && *end == '\0' && n >= 1 && n <= 1024)
                   ? std::string()
                   : std::string("auto or 1..1024");
      });
  sweep->footer(
      "A sweep file: [sweep] base = CONFIG (relative to the sweep file), out_dir, repeats (seeds run.seed +\n"
      "0..repeats-1) or seeds = [..], parallel = \"auto\" or N, set = [\"section.key=value\", ...]; [grid]\n"
      "\"section.key\" = [values] (every combination); [[points]] tables of key = value with an optional "
      "name\n"
      "(crossed with the grid); [fit] size = \"params\" or a key, group_by = [keys] (L(N) = A*N^-alpha + E "
      "per\n"
      "group), tokens = true. Each point runs `longwave run BASE --set ...` in out_dir/points/<id>/ "
      "(log.txt).\n"
      "Parallelism: with N cores and points needing train.workers x train.threads threads each (0 counted "
      "as\n"
      "1), auto runs points at once while their threads fit the cores, giving train.threads = 0 points one\n"
      "thread per worker; if no two fit, one at a time. Finished points are skipped on the next run and\n"
      "interrupted ones resume from their checkpoints. Writes out_dir/results.csv, results.jsonl, "
      "sweep.html\n"
      "(and fit.json). Exit codes: 0 all done, 1 a point failed, 2 bad sweep file, 4 out_dir in use, 130\n"
      "interrupted.");
  return sweep;
}

/// `sweep`: checks the sweep file (exit 2 naming the entry), then runs it.
int cmd_sweep(cli_values& v, const char* argv0) {
  cli::sweep::sweep_spec spec;
  try {
    spec = cli::sweep::load_sweep(v.sweep_path, [](const config::train_config& c) {
      return static_cast<double>(models::closed_form_param_count(models::spec_of(c.model, config_vocab(c))));
    });
  } catch (const cli::sweep::sweep_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  v.sweep.exe = self_exe(argv0);
  if (!v.sweep_parallel.empty())
    v.sweep.parallel = v.sweep_parallel == "auto" ? 0 : std::stol(v.sweep_parallel);
  return cli::sweep::run_sweep(spec, v.sweep);
}

/// `keys new`: the key files of a cluster (see add_keys).
int cmd_keys_new(const cli_values& v) {
  runtime::init_logging("info");
  std::vector<std::string> names = v.keys_nodes;
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
    const bool ok = !n.empty() && n.size() <= 32 && std::all_of(n.begin(), n.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!ok || std::count(names.begin(), names.end(), n) > 1) {
      std::fprintf(stderr, "keys new: node name '%s': %s\n", n.c_str(),
                   ok ? "given twice" : "names are 1..32 characters of A-Z a-z 0-9 _ -");
      return 2;
    }
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

int cmd_run(const cli_values& v) {
  runtime::init_logging(v.log_level);
  config::train_config cfg;
  std::vector<std::string> warnings;
  try {
    cfg = config::load_config_file(v.config_path, v.overrides, &warnings);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  for (const auto& w : warnings) spdlog::warn("{}", w);
  return actors::run_training(cfg, v.ropts);
}

/// `coordinator` (as_coordinator) or `node`.
int cmd_role(const cli_values& v, bool as_coordinator) {
  runtime::init_logging(v.log_level);
  auto spec = load_cluster(v.cluster_path, v.cluster_overrides);
  if (!spec) return 2;
  if (as_coordinator) return cluster::run_master_role(*spec, v.coordinator_bind);
  actors::run_options nopts;
  nopts.fresh = v.cluster_fresh;
  nopts.dry_run = v.node_dry_run;
  nopts.leave = v.node_leave;
  nopts.endpoint = v.node_endpoint;
  nopts.workers = v.node_workers;
  return cluster::run_node_role(*spec, v.node_name, nopts);
}

int cmd_prepare(const cli_values& v) {
  try {
    auto d = models::data::prepare_dataset(v.input.empty() ? actors::default_corpus_path() : v.input,
                                           *config::from_string<config::tokenizer_kind>(v.tokenizer), v.vocab,
                                           v.val_fraction, v.out_dir,
                                           [](const std::string& l) { spdlog::info("{}", l); });
    std::printf("train: %s (%ld tokens)\nval: %s (%ld tokens)\ntokenizer: %s (vocab %ld)\n",
                d.train_path.c_str(), d.n_train_tokens, d.val_path.c_str(), d.n_val_tokens,
                d.tokenizer_path.c_str(), d.vocab_size);
    return 0;
  } catch (const lw_error& e) {
    spdlog::error("{}", e.what());
    // corrupt_data: the input is empty, binary or malformed, a bad argument (as in `run`).
    return e.code() == errc::invalid_config || e.code() == errc::corrupt_data ? 2 : 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", describe(e));
    return 1;
  }
}

/// Runs the subcommand that was given.
int dispatch(const subcommands& sub, cli_values& v, const char* argv0) {
  if (sub.run->parsed()) return cmd_run(v);
  if (sub.coord->parsed() || sub.node->parsed()) return cmd_role(v, sub.coord->parsed());
  if (sub.stop->parsed()) {
    runtime::init_logging("info");
    auto spec = load_cluster(v.cluster_path, v.cluster_overrides);
    return spec ? cluster::request_cluster_stop(*spec) : 2;
  }
  if (sub.launch->parsed())
    return cli::launch(self_exe(argv0), v.cluster_path, v.cluster_overrides, v.cluster_fresh, v.observe);
  if (sub.report->parsed()) {
    runtime::init_logging("info");
    return cli::report::write(v.report_dir, v.report_out);
  }
  if (sub.eval->parsed()) return actors::run_eval(v.ckpt, v.batches);
  if (sub.exp->parsed()) return cli::export_checkpoint(v.exp);
  if (sub.prep->parsed()) return cmd_prepare(v);
  if (sub.presets->parsed()) return cmd_presets(v.pv, v.pt, v.presets_config, v.shape_overrides);
  if (sub.keys_new->parsed()) return cmd_keys_new(v);
  if (sub.sweep->parsed()) return cmd_sweep(v, argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  runtime::keep_freed_buffers();
  runtime::init_logging();
  CLI::App app{
      "Longwave: DiLoCo training of Llama-style language models over slow links.\n"
      "Workers run H inner AdamW steps on their own data, average their pseudo-gradients and apply them with "
      "an\n"
      "outer Nesterov SGD step. Exit codes: 0 ok, 1 runtime failure, 2 bad config or arguments, 130 "
      "interrupted."};
  app.set_version_flag(
      "--version",
      [] {
        return "longwave on " + models::cpu_kernels() + "\ngpu: " + models::gpu_summary() + "; " +
               actors::nccl_summary();
      },
      "Print the CPU, the LibTorch version and the kernels it uses, the GPUs and CUDA, and exit");
  app.require_subcommand(1);
  cli_values v;
  subcommands sub;
  // In this order in --help.
  sub.run = add_run(app, v);
  sub.eval = add_eval(app, v);
  sub.exp = add_export(app, v);
  sub.prep = add_data_prepare(app, v);
  sub.coord = add_coordinator(app, v);
  sub.node = add_node(app, v);
  sub.stop = add_stop(app, v);
  sub.launch = add_launch(app, v);
  sub.report = add_report(app, v);
  sub.presets = add_presets(app, v);
  sub.keys_new = add_keys(app, v);
  sub.sweep = add_sweep(app, v);
  // CLI11 would treat `longwave nosuch --help` as a request for the main help (exit 0).
  if (argc > 1 && argv[1][0] != '-') {
    try {
      (void)app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      std::fprintf(stderr, "longwave: unknown command '%s' (see longwave --help)\n", argv[1]);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return dispatch(sub, v, argv[0]);
}
