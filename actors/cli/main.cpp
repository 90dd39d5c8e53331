// The `longwave` command line: run, eval, data prepare, presets.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "actors/training.hpp"
#include "config/config_loader.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/model_spec.hpp"
#include "runtime/errors.hpp"
#include "runtime/log.hpp"

using namespace longwave;

namespace {

int cmd_presets(int64_t vocab, int64_t seq_len) {
  std::printf("%-6s %6s %7s %6s %8s %6s %14s\n", "preset", "dim", "layers", "heads", "kv_heads", "ffn",
              "parameters");
  for (const auto& name : models::preset_names()) {
    auto s = models::preset_spec(name, vocab, seq_len);
    std::printf("%-6s %6ld %7ld %6ld %8ld %6ld %14ld\n", name.c_str(), s.dim, s.n_layers, s.n_heads,
                s.n_kv_heads, s.ffn_hidden, models::closed_form_param_count(s));
  }
  std::printf("(vocab %ld, context %ld; parameters include the tied embedding)\n", vocab, seq_len);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  runtime::init_logging();
  CLI::App app{
      "Longwave: DiLoCo training of Llama-style language models over slow links.\n"
      "Workers run H inner AdamW steps on their own data, average their pseudo-gradients and apply them with "
      "an\n"
      "outer Nesterov SGD step. Exit codes: 0 ok, 1 runtime failure, 2 bad config or arguments, 130 "
      "interrupted."};
  app.require_subcommand(1);

  // run
  auto* run = app.add_subcommand("run", "Train from a TOML config (resumes from the latest checkpoint)");
  std::string config_path;
  std::vector<std::string> overrides;
  actors::run_options ropts;
  std::string log_level = "info";
  run->add_option("config", config_path, "TOML config file (see examples/)")->required();
  run->add_option("--set", overrides, "Override a field: --set section.key=value (repeatable)");
  run->add_flag("--dry-run", ropts.dry_run,
                "Validate, print the resolved config, parameter count and memory estimate; do not train");
  run->add_flag("--fresh", ropts.fresh, "Start over: delete this run's checkpoints and loss trace first");
  run->add_option("--log-level", log_level, "trace, debug, info, warn or error")->capture_default_str();
  run->footer(
      "Progress lines show round, step, loss, tokens/s and ETA; the run ends with the validation "
      "perplexity.\n"
      "Ctrl-C saves a checkpoint and exits with code 130; the same command then resumes exactly.\n"
      "Files in run.out_dir: config.toml, loss_trace.tsv, checkpoints/, data/ (token shards).");

  // eval
  auto* eval = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint's theta_global");
  std::string ckpt;
  int64_t batches = 0;
  eval->add_option("checkpoint", ckpt, "A .lwc checkpoint file or a checkpoint directory (newest valid)")
      ->required();
  eval->add_option("--batches", batches, "Validation batches (default: the run's eval.batches)");

  // data prepare
  auto* data = app.add_subcommand("data", "Data tools");
  auto* prep =
      data->add_subcommand("prepare", "Tokenize a corpus into llm.c .bin shards (train.bin, val.bin)");
  data->require_subcommand(1);
  std::string input, out_dir, tokenizer = "byte";
  int64_t vocab = 1024;
  double val_fraction = 0.05;
  prep->add_option("input", input, "Text file, JSONL file (field \"text\"), or '' for the bundled KJV");
  prep->add_option("--out", out_dir, "Output directory")->required();
  prep->add_option("--tokenizer", tokenizer, "byte or bpe")
      ->check(CLI::IsMember({"byte", "bpe"}))
      ->capture_default_str();
  prep->add_option("--vocab", vocab, "BPE vocabulary size")->capture_default_str();
  prep->add_option("--val-fraction", val_fraction, "Share of tokens held out for validation")
      ->capture_default_str();

  // presets
  auto* presets = app.add_subcommand("presets", "List the model presets and their parameter counts");
  int64_t pv = 256, pt = 128;
  presets->add_option("--vocab", pv, "Vocabulary size")->capture_default_str();
  presets->add_option("--seq-len", pt, "Context length")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  if (run->parsed()) {
    runtime::init_logging(log_level);
    config::train_config cfg;
    try {
      cfg = config::load_config_file(config_path, overrides);
    } catch (const config::config_error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    return actors::run_training(cfg, ropts);
  }
  if (eval->parsed()) return actors::run_eval(ckpt, batches);
  if (prep->parsed()) {
    try {
      auto d = models::data::prepare_dataset(input.empty() ? actors::default_corpus_path() : input, tokenizer,
                                             vocab, val_fraction, out_dir,
                                             [](const std::string& l) { spdlog::info("{}", l); });
      std::printf("train: %s (%ld tokens)\nval: %s (%ld tokens)\ntokenizer: %s (vocab %ld)\n",
                  d.train_path.c_str(), d.n_train_tokens, d.val_path.c_str(), d.n_val_tokens,
                  d.tokenizer_path.c_str(), d.vocab_size);
      return 0;
    } catch (const lw_error& e) {
      spdlog::error("{}", e.what());
      return e.code() == errc::invalid_config ? 2 : 1;
    }
  }
  if (presets->parsed()) return cmd_presets(pv, pt);
  return 2;
}
