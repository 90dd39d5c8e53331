// The subcommands and their options (cli/commands.hpp).
#include "cli/commands.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "config/train_config.hpp"
#include "runtime/log/log.hpp"
#include "runtime/process/std_streams.hpp"

namespace longwave::cli {

namespace {

/// --log-level, one of spdlog's names (any other would silence every message, errors included).
void add_log_level(CLI::App* app, cli_values& v) {
  app->add_option("--log-level", v.log_level, "trace, debug, info, warn or error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

CLI::App* add_run(CLI::App& app, cli_values& v) {
  auto* run = app.add_subcommand("run", "Train from a TOML config (resumes from the latest checkpoint)");
  run->add_option("config", v.config_path, "TOML config file (see examples/)")->required();
  run->add_option("--set", v.overrides, "Override a field: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  run->add_flag("--dry-run", v.run_dry_run,
                "Validate, print the resolved config, parameter count and memory estimate; do not train");
  run->add_flag("--fresh", v.run_fresh,
                "Start over: delete this run's checkpoints, loss trace, metrics.jsonl and result.json first");
  add_log_level(run, v);
  run->footer(
      "Progress lines show round, step, loss, tokens/s and ETA; the run ends with the validation "
      "perplexity.\n"
      "Ctrl-C saves a checkpoint and exits with code 130; the same command then resumes exactly.\n"
      "Files in run.out_dir: config.toml, loss_trace.tsv, metrics.jsonl, result.json, checkpoints/, data/ "
      "(token shards).\n"
      "The settings of every key: docs/01-configuration.md and the chapters it links.");
  return run;
}

/// A whole number in [lo, hi], in decimal digits: CLI::PositiveNumber's message names a double's range, and
/// CLI::Range said "1e3" or "abc" was "not in range" (and took "0x10" as 16).
CLI::Validator whole_number(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) {
  const std::string range = hi == std::numeric_limits<int64_t>::max() ? fmt::format("of at least {}", lo)
                                                                      : fmt::format("in [{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(text, &used, 10);
          if (used == text.size() && v >= lo && v <= hi) return "";
        } catch (const std::out_of_range&) {
          if (text.find('-') == std::string::npos && hi == std::numeric_limits<int64_t>::max())
            return text + " is too large (the most is 9223372036854775807)";
        } catch (const std::exception&) {
        }
        return text + " is not a whole number " + range;
      },
      hi == std::numeric_limits<int64_t>::max() ? fmt::format("INT>={}", lo)
                                                : fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator at_least_one() {
  return whole_number(1);
}

CLI::App* add_eval(CLI::App& app, cli_values& v) {
  auto* eval = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint's theta_global");
  eval->add_option("checkpoint", v.ckpt, "A .lwc checkpoint file or a checkpoint directory (newest valid)")
      ->required();
  eval->add_option("--batches", v.batches, "Validation batches (default: the run's eval.batches)")
      ->check(at_least_one());
  eval->add_option(
      "--data", v.eval_data,
      "The run's corpus (or directory of token shards) where it is now, instead of the data.path "
      "the checkpoint names (default: that)");
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

CLI::App* add_sample(CLI::App& app, cli_values& v) {
  auto* sample =
      app.add_subcommand("sample", "Write text with a checkpoint's theta_global after a prompt (on the CPU)");
  sample
      ->add_option("checkpoint", v.sample.checkpoint,
                   "A .lwc checkpoint file or a checkpoint directory (newest valid), as for eval")
      ->required();
  sample->add_option("--prompt", v.sample.prompt, "Text the model goes on from (default: a line break)");
  sample->add_option("--tokens", v.sample.tokens, "New tokens to write")
      ->check(at_least_one())
      ->capture_default_str();
  sample
      ->add_option("--temperature", v.sample.temperature, "Softmax temperature; 0 takes the likeliest token")
      ->check([](const std::string& s) {
        char* end = nullptr;
        const double t = std::strtod(s.c_str(), &end);
        return end != s.c_str() && *end == '\0' && std::isfinite(t) && t >= 0 && t <= 100
                   ? std::string()
                   : std::string("a number in [0, 100]");
      })
      ->capture_default_str();
  sample->add_option("--top-k", v.sample.top_k, "Draw among the k likeliest tokens (0: all)")
      ->check(whole_number(0, int64_t{1} << 20))
      ->capture_default_str();
  sample->add_option("--seed", v.sample.seed, "Seed of the draws (one seed, one text)")
      ->check([](const std::string& s) {
        // CLI11 would take "" as 0 and wrap -1 or an overflow.
        const bool digits = !s.empty() && s.size() <= 20 &&
                            std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
        return digits && (s.size() < 20 || s <= "18446744073709551615")
                   ? std::string()
                   : std::string("a whole number in [0, 18446744073709551615]");
      })
      ->capture_default_str();
  sample->footer(
      "The prompt and the new text go to stdout, a line about the model and the speed to stderr. The run's\n"
      "tokenizer.txt is looked for as export does (beside the checkpoint directory, then the run's data\n"
      "folder); a byte-level run needs none. The model reads the prompt's last seq_len tokens, then\n"
      "one token at a time over a KV cache; once the context is full it keeps the last half and goes on.");
  return sample;
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
  prep->add_option("--vocab", v.vocab, "BPE vocabulary size (257..65535, as data.bpe_vocab_size)")
      ->check(whole_number(257, 65535))
      ->capture_default_str();
  prep->add_option("--val-fraction", v.val_fraction, "Share of tokens held out for validation, in (0, 0.5]")
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
  coord->add_option("--set", v.cluster_overrides, "Override a field: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  coord->add_option("--bind", v.coordinator_bind,
                    "Which of [cluster] coordinator's addresses to listen on (default: the first); a standby "
                    "coordinator started elsewhere takes the running cluster over");
  add_log_level(coord, v);
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
  node->add_option("--workers", v.node_workers, "A node not in the cluster file: its workers (default 1)")
      ->check(at_least_one());
  node->add_option("--set", v.cluster_overrides, "Override a field: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  auto* fresh = node->add_flag("--fresh", v.cluster_fresh,
                               "Start over: delete this node's checkpoints and loss trace first");
  auto* dry = node->add_flag("--dry-run", v.node_dry_run,
                             "Validate and print this node's resolved config; do not join");
  // --leave asks a running node: it starts nothing, so it would silently ignore these.
  node->add_flag("--leave", v.node_leave,
                 "Ask the running node NAME to leave the cluster at its next round boundary (it saves its "
                 "checkpoint and exits 0; the others go on), then exit")
      ->excludes(fresh)
      ->excludes(dry);
  add_log_level(node, v);
  node->footer(cluster_footer);
  return node;
}

CLI::App* add_stop(CLI::App& app, cli_values& v) {
  auto* stop = app.add_subcommand(
      "stop", "Stop a running cluster: every node finishes its current round, saves its checkpoint, exits 0");
  stop->add_option("cluster", v.cluster_path, "Cluster TOML file")->required();
  stop->add_option("--set", v.cluster_overrides, "Override a field: --set section.key=value (repeatable)")
      ->allow_extra_args(false);
  stop->add_flag("--wait", v.stop_wait,
                 "Return once the run ended and its processes here exited, with the coordinator's last line");
  stop->footer(
      "The coordinator asks every node where it can stop and tells all of them the same round, so their\n"
      "checkpoints agree; then it exits 0 too. The same `coordinator` and `node` commands resume the run.\n"
      "With CURVE this needs the cluster's own key pair (keys/cluster.secret, as the coordinator's machine\n"
      "has it). Returns once the coordinator answered: exit 0 when it stops, 1 when it cannot be reached,\n"
      "2 for a refused key. With --wait, once the run ended and its node processes and the coordinator's\n"
      "ports on this machine are gone: 0 when it stopped (or finished), the nodes that remained with their\n"
      "checkpoints and any removed on the way named; 1 when it ended otherwise or the coordinator went\n"
      "silent for 10 s first.\n"
      "To stop one node only: longwave node CLUSTER.toml --node NAME --leave.");
  return stop;
}

CLI::App* add_launch(CLI::App& app, cli_values& v) {
  auto* launch = app.add_subcommand(
      "launch",
      "Start the coordinator and every node of a cluster file as local processes (Ctrl-C stops all)");
  launch->add_option("cluster", v.cluster_path, "Cluster TOML file")->required();
  launch->add_option("--set", v.cluster_overrides, "Override a field for every role (repeatable)")
      ->allow_extra_args(false);
  launch->add_flag("--fresh", v.cluster_fresh, "Every node starts over (deletes its checkpoints first)");
  launch->add_flag("--observe", v.observe.enabled,
                   "Also start Debian's Prometheus server scraping every role (data in RUN_DIR/prometheus)");
  launch->add_option("--observe-port", v.observe.port, "Port of Prometheus on 127.0.0.1")
      ->check(whole_number(1, 65535))
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
      "Output lines are prefixed with [coordinator] or [node name]; each role's output is also\n"
      "appended to RUN_DIR/logs/<role>.log, which keeps its last lines when launch itself is killed\n"
      "(the roles then stop with a checkpoint). The exit code is 0 when every role succeeded, 130 after\n"
      "Ctrl-C, else the first failing node's code, else the coordinator's. With --observe, the\n"
      "Prometheus UI is at http://127.0.0.1:<observe-port>; import the dashboards from dashboards/ into\n"
      "Grafana.");
  return launch;
}

CLI::App* add_report(CLI::App& app, cli_values& v) {
  auto* report = app.add_subcommand(
      "report", "Write one self-contained HTML report (inline SVG charts) of a run from its metrics.jsonl");
  report->add_option("run_dir", v.report_dir, "The run's out_dir (a cluster's out_dir: one series per node)")
      ->required();
  report->add_option("--out", v.report_out, "Output file (default: RUN_DIR/report.html)")
      ->check(CLI::Validator(
          [](const std::string& out) {
            return out.empty() ? std::string("--out is empty: name the page's file") : "";
          },
          "FILE"));
  return report;
}

CLI::App* add_presets(CLI::App& app, cli_values& v) {
  auto* presets = app.add_subcommand("presets", "List the model presets and their parameter counts");
  // The ranges of model.vocab_size and model.seq_len (config/schema.hpp).
  auto* vocab = presets->add_option("--vocab", v.pv, "Vocabulary size (2..65536)")
                    ->capture_default_str()
                    ->check(whole_number(2, 65536));
  auto* seq_len = presets->add_option("--seq-len", v.pt, "Context length (8..8192)")
                      ->capture_default_str()
                      ->check(whole_number(8, 8192));
  // A config brings its own vocabulary and context: --vocab or --seq-len beside it would go unused.
  presets
      ->add_option("--config", v.presets_config,
                   "Also count the parameters of this config's model (its vocab and context too)")
      ->excludes(vocab)
      ->excludes(seq_len);
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
  make->add_option("--nodes", v.keys_nodes, "A key pair for each of these node names (comma-separated)");
  make->footer(
      "Writes DIR/cluster.{public,secret} (unless DIR already has them) and DIR/nodes/NAME.{public,secret},\n"
      "every file mode 0600. An existing node key is never overwritten: --nodes naming one exits 2;\n"
      "--cluster keeps it and keys only the nodes that have none. The coordinator needs cluster.secret\n"
      "and nodes/*.public; node NAME needs cluster.public and nodes/NAME.secret. A key can be revoked\n"
      "with [security] revoked = [\"NAME\"] in the coordinator's cluster file.");
  return make;
}

CLI::App* add_sweep(CLI::App& app, cli_values& v) {
  auto* sweep = app.add_subcommand(
      "sweep",
      "Run a grid or list of configs over seeds (resumable); results table, HTML page, scaling fits");
  sweep->add_option("sweep_file", v.sweep_path, "Sweep TOML file (see examples/sweeps/)")->required();
  sweep->add_flag("--dry-run", v.sweep.dry_run, "Check every point and print the plan; run nothing");
  auto* fresh = sweep->add_flag(
      "--fresh", v.sweep.fresh,
      "Start every point over (longwave run --fresh), ignoring what earlier invocations finished");
  sweep
      ->add_flag("--results-only", v.sweep.results_only,
                 "Rewrite results, page and fits from the points finished so far; run nothing")
      ->excludes(fresh);  // it would rewrite the results as all pending
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

}  // namespace

subcommands add_commands(CLI::App& app, cli_values& v, std::function<std::string()> version) {
  app.description(
      "Longwave: DiLoCo training of Llama-style language models over slow links.\n"
      "Workers run H inner AdamW steps on their own data, average their pseudo-gradients and apply them with "
      "an\n"
      "outer Nesterov SGD step. Exit codes: 0 ok, 1 runtime failure, 2 bad config or arguments, 3 "
      "checkpoints "
      "could\nnot be written, 4 out_dir in use by another run, 130 interrupted.");
  app.set_version_flag("--version", std::move(version),
                       "Print the commit it was built from, the wire protocol, the CPU, the LibTorch version "
                       "and the kernels it uses, the GPUs and CUDA, and exit");
  app.require_subcommand(1);
  subcommands sub;
  // In this order in --help.
  sub.run = add_run(app, v);
  sub.eval = add_eval(app, v);
  sub.exp = add_export(app, v);
  sub.sample = add_sample(app, v);
  sub.prep = add_data_prepare(app, v);
  sub.coord = add_coordinator(app, v);
  sub.node = add_node(app, v);
  sub.stop = add_stop(app, v);
  sub.launch = add_launch(app, v);
  sub.report = add_report(app, v);
  sub.presets = add_presets(app, v);
  sub.keys_new = add_keys(app, v);
  sub.sweep = add_sweep(app, v);
  return sub;
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  // CLI11 would treat `longwave nosuch --help` as a request for the main help (exit 0), and says only "A
  // subcommand is required" for `longwave --bogus` or `longwave data nosuch`: the word is named here.
  std::string path = "longwave";
  CLI::App* level = &app;
  for (int i = 1; i < argc && level->get_require_subcommand_min() > 0; ++i) {
    const std::string word = argv[i];
    if (!word.empty() && word[0] == '-') {
      if (level->get_option_no_throw(word) != nullptr) break;  // --help, --version: CLI11's
      std::fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", path.c_str(), word.c_str(),
                   path.c_str());
      return 2;
    }
    try {
      level = level->get_subcommand(word);
    } catch (const CLI::OptionNotFound&) {
      std::fprintf(stderr, "%s: unknown command '%s' (see %s --help)\n", path.c_str(), word.c_str(),
                   path.c_str());
      return 2;
    }
    path += " " + word;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return std::nullopt;
}

std::optional<int> keep_stdout_for_product(const subcommands& sub) {
  if (!sub.stdout_is_product()) return std::nullopt;
  if (runtime::stdout_was_closed()) {
    const char* what = sub.eval->parsed() ? "eval: standard output is closed: nowhere to write the loss"
                       : sub.sample->parsed()
                           ? "sample: standard output is closed: nowhere to write the text"
                           : "presets: standard output is closed: nowhere to write the table";
    std::fprintf(stderr, "%s\n", what);
    return 1;
  }
  runtime::information_to_stderr();
  // A reader that goes early (`sample … | head`) fails the next write with EPIPE, instead of SIGPIPE killing
  // the process (141): sample then ends quietly with 0, the others exit 1 saying so.
  std::signal(SIGPIPE, SIG_IGN);
  return std::nullopt;
}

std::string self_exe(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace longwave::cli
