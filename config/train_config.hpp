#pragma once
// Plain, validated structs for one Longwave run. Every field has a default; config/config_loader fills
// them from TOML and `--set section.key=value` overrides.
#include <cstdint>
#include <string>

namespace longwave::config {

/// [run]: what to train and where to write it.
struct run_section {
  std::string mode = "diloco";  ///< "diloco" | "single" | "ddp"
  uint64_t seed = 1234;
  std::string out_dir = "runs/default";  ///< checkpoints, loss trace, resolved config
  std::string name = "";                 ///< label for logs and metrics; defaults to the config file stem
};

/// [model]: which Llama-style preset and in what precision.
struct model_section {
  std::string preset = "tiny";  ///< "tiny" | "small" | "150m" | "1b"
  std::string dtype = "fp32";   ///< "fp32" | "bf16"
  int64_t seq_len = 128;        ///< training context T
  int64_t vocab_size = 0;       ///< 0: take it from the tokenizer
};

/// [data]: corpus, tokenizer and shards.
struct data_section {
  std::string path =
      "";  ///< "" = bundled KJV; a .txt, a .jsonl (field "text") or a dir with train.bin/val.bin
  std::string tokenizer = "byte";  ///< "byte" | "bpe"
  int64_t bpe_vocab_size = 1024;   ///< only for tokenizer = "bpe"; 257..65535
  double val_fraction = 0.05;      ///< share of the corpus held out for validation, (0, 0.5]
  std::string cache_dir = "";      ///< "" = <out_dir>/data
};

/// [train]: the inner loop (AdamW) and the outer schedule.
struct train_section {
  int64_t workers = 4;        ///< M local workers (replicas) in this process
  int64_t inner_steps = 50;   ///< H
  int64_t rounds = 10;        ///< outer rounds; total inner steps per worker = rounds * inner_steps
  int64_t batch_size = 8;     ///< sequences per worker per inner step
  double lr = 4e-3;           ///< peak inner learning rate
  int64_t warmup_steps = 50;  ///< linear warm-up, in inner steps
  double min_lr_ratio = 0.1;  ///< cosine decays to lr * min_lr_ratio
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  ///< max global grad norm; 0 disables
  int64_t threads = 0;     ///< torch threads per worker; 0 = cores / workers (at least 1)
};

/// [outer]: the outer optimizer, SGD with Nesterov momentum.
struct outer_section {
  double lr = 0.7;
  /// In (-1, 1). A negative momentum (with nesterov = false) counters the momentum-like effect of a stale
  /// average under diloco.outer = "delayed" or "eager" (ARCHITECTURE.md, "DiLoCo step").
  double momentum = 0.9;
  bool nesterov = true;
};

/// [diloco]: when the averaged pseudo-gradient is applied (ARCHITECTURE.md, "Outer-step policies").
struct diloco_section {
  /// "sync": round t's average is applied at the end of round t (classic DiLoCo; workers wait for it).
  /// "delayed": one outer step late, so the all-reduce of round t overlaps the inner steps of round t+1.
  /// "eager": the timing of "delayed", but each worker adds its own fresh pseudo-gradient (Kale et al. 2025).
  /// "streaming": Streaming DiLoCo: P fragments of layers, each synchronised once per round at its own
  /// offset, its all-reduce overlapping tau inner steps (Douillard et al. 2025).
  std::string outer = "sync";
  int64_t fragments = 2;  ///< streaming: P, fragments of layers (at most the model's layers)
  std::string fragment_pattern = "strided";  ///< streaming: "strided" (layer l in l mod P) | "sequential"
  int64_t tau = 1;     ///< streaming: inner steps each fragment's all-reduce overlaps (< inner_steps / P)
  double alpha = 0.5;  ///< streaming: theta_f <- (1 - alpha) * theta_f^global + alpha * theta_f^local
};

/// [eval]: validation of theta_global.
struct eval_section {
  int64_t every_rounds = 5;  ///< 0 = only at the end
  int64_t batches = 16;      ///< validation batches of batch_size x seq_len
  /// Evaluate off the training path: an evaluator actor with its own model copy scores a clone of theta while
  /// the workers go on (the last evaluation is waited for). false: worker 0 evaluates between rounds.
  bool async = true;
};

/// [checkpoint]: asynchronous, atomic, checksummed snapshots.
struct checkpoint_section {
  int64_t every_rounds = 1;  ///< 0 = only at the end and on Ctrl-C
  int64_t keep = 3;          ///< keep the last K valid checkpoints
  std::string dir = "";      ///< "" = <out_dir>/checkpoints
  /// The run stops (exit code 3) once this many checkpoint writes in a row have failed (a full disk, a
  /// read-only directory): the work since the newest checkpoint on disk is then all that can be lost. 0:
  /// never stop for it (the exit code still says when the final state is not on disk).
  int64_t max_failed_writes = 2;
};

/// [metrics]: Prometheus text exposition (and RUN_DIR/metrics.jsonl).
struct metrics_section {
  bool enabled = true;
  int64_t port = 9464;                ///< 0 = pick a free port (logged at start)
  std::string address = "127.0.0.1";  ///< IPv4 address to serve /metrics on; 0.0.0.0 = every interface
};

/// [comm]: how pseudo-gradients travel between nodes (cluster runs; a single process averages in memory).
struct comm_section {
  std::string dtype = "fp32";   ///< wire element type: "fp32" | "fp16" | "bf16" | "int8"; sums are fp32
  bool int8_codebook = false;   ///< int8 only: 256-bin codebook of bin means instead of one scale per chunk
  bool error_feedback = false;  ///< carry this node's quantization residual into the next round
  int64_t chunk_kib = 1024;     ///< payload of one ring chunk (pipelining granularity), KiB
  double timeout_s = 300;       ///< an all-reduce fails after this long without progress
};

/// [runtime]: actor system and deadlines.
struct runtime_section {
  double round_timeout_s = 3600;   ///< deadline for one worker's inner round
  double request_timeout_s = 120;  ///< deadline for every other request
  int64_t log_every_steps = 10;    ///< progress line period, in inner steps
};

/// The whole resolved configuration of one run.
struct train_config {
  run_section run;
  model_section model;
  data_section data;
  train_section train;
  outer_section outer;
  diloco_section diloco;
  eval_section eval;
  checkpoint_section checkpoint;
  metrics_section metrics;
  comm_section comm;
  runtime_section runtime;
};

}  // namespace longwave::config
