#pragma once
// Plain, validated structs for one Longwave run, and the enums of its fixed choices with their TOML names.
// Every field has a default; config/config_loader fills them from TOML and `--set section.key=value`
// overrides; the fields and their rules are listed in config/schema.hpp.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/core.h>

namespace longwave::config {

/// The TOML names of a config enum's values, indexed by value. Each enum below specialises it once with a
/// `names` array; to_string, from_string, the loader's messages and to_toml all read that one table.
template <class E>
struct enum_names {};

/// True for the config enums: the types with an enum_names table.
template <class T, class = void>
struct is_config_enum : std::false_type {};
template <class T>
struct is_config_enum<T, std::void_t<decltype(enum_names<T>::names)>> : std::true_type {};
template <class T>
inline constexpr bool is_config_enum_v = is_config_enum<T>::value;

/// run.mode: how the workers' updates are combined.
enum class run_mode : uint8_t {
  diloco,  ///< H inner steps per replica, then an outer step on the averaged pseudo-gradient
  single,  ///< one worker that keeps its own weights (the baseline)
  ddp,     ///< gradient averaging every step
};
template <>
struct enum_names<run_mode> {
  static constexpr std::array<const char*, 3> names{"diloco", "single", "ddp"};
};

/// diloco.outer: when the averaged pseudo-gradient is applied (docs/02-policies.md).
/// (actors/outer_optimizer.hpp's outer_policy is the optimizer's state for one policy, not this choice.)
enum class outer_policy_kind : uint8_t {
  sync,     ///< round t's average is applied at the end of round t (classic DiLoCo; workers wait for it)
  delayed,  ///< one outer step late, so the all-reduce of round t overlaps the inner steps of round t+1
  eager,    ///< the timing of delayed, but each worker adds its own fresh pseudo-gradient (Kale et al. 2025)
  streaming,  ///< P fragments of layers, each synchronised once per round at its own offset, its all-reduce
              ///< overlapping tau inner steps (Douillard et al. 2025)
  async,  ///< no round barrier: each node contributes when its inner steps are done, and the master merges
          ///< what has arrived into a new version of theta ([async]; a cluster only)
};
template <>
struct enum_names<outer_policy_kind> {
  static constexpr std::array<const char*, 5> names{"sync", "delayed", "eager", "streaming", "async"};
};

/// async.age_scaling: how a pseudo-gradient's weight shrinks with its staleness.
enum class age_scaling_kind : uint8_t {
  none,  ///< every merged contribution counts fully (up to async.max_staleness)
  cgad,  ///< CGAD: a cosine gate reaching 0 at cgad_cutoff versions, times exp(-cgad_alpha * staleness)
};
template <>
struct enum_names<age_scaling_kind> {
  static constexpr std::array<const char*, 2> names{"none", "cgad"};
};

/// diloco.fragment_pattern: which layers make up each streaming fragment.
enum class fragment_layout : uint8_t {
  strided,     ///< layer l in fragment l mod P
  sequential,  ///< layer l in fragment l * P / L (contiguous blocks)
};
template <>
struct enum_names<fragment_layout> {
  static constexpr std::array<const char*, 2> names{"strided", "sequential"};
};

/// model.dtype: the precision of the model's weights and compute.
enum class model_dtype : uint8_t {
  fp32,
  bf16,  ///< bf16 model with an fp32 master copy
};
template <>
struct enum_names<model_dtype> {
  static constexpr std::array<const char*, 2> names{"fp32", "bf16"};
};

/// train.autocast: the precision of the inner steps' compute, resolved per worker device (models/device.hpp).
enum class autocast_mode : uint8_t {
  off,        ///< the model's own dtype (model.dtype)
  bf16,       ///< bf16 autocast of matrix products (a CUDA device)
  automatic,  ///< "auto": bf16 on a CUDA device, off on the CPU
};
template <>
struct enum_names<autocast_mode> {
  static constexpr std::array<const char*, 3> names{"off", "bf16", "auto"};
};

/// data.tokenizer: how the corpus becomes tokens.
enum class tokenizer_kind : uint8_t {
  byte,  ///< one token per byte (vocabulary 256)
  bpe,   ///< byte-level BPE trained on the corpus (data.bpe_vocab_size)
};
template <>
struct enum_names<tokenizer_kind> {
  static constexpr std::array<const char*, 2> names{"byte", "bpe"};
};

/// data.partition: which train windows each worker (global rank) reads; the parts never overlap.
enum class data_partition : uint8_t {
  contiguous,  ///< rank m of M reads the tokens [m*N/M, (m+1)*N/M)
  iid,         ///< blocks of 8 windows spread over the whole corpus, block b to rank b mod M
  books,       ///< whole documents (the default corpus: whole books), contiguous runs of them per rank
};
template <>
struct enum_names<data_partition> {
  static constexpr std::array<const char*, 3> names{"contiguous", "iid", "books"};
};

/// comm.dtype: element type of a chunk on the wire; sums are fp32. comm uses this enum as comm::wire_dtype,
/// so the numeric values are part of the wire format: never renumber them, only append.
/// sparse: the top-k low-bit codec (comm/sparse_codec.hpp); its messages are all-gathered, not ring-summed.
enum class wire_dtype : uint8_t { fp32 = 0, fp16 = 1, bf16 = 2, int8 = 3, sparse = 4 };
template <>
struct enum_names<wire_dtype> {
  static constexpr std::array<const char*, 5> names{"fp32", "fp16", "bf16", "int8", "sparse"};
};

/// comm.sparse_indices: how comm.dtype = "sparse" picks the values each node sends.
enum class sparse_index_mode : uint8_t {
  topk,    ///< each node its own top-k per chunk; the messages differ, so they are all-gathered
  shared,  ///< every node the same seeded indices per round; the values are summed on the dense int8 ring
};
template <>
struct enum_names<sparse_index_mode> {
  static constexpr std::array<const char*, 2> names{"topk", "shared"};
};

/// comm.backend: which collective averages across nodes (comm/collective.hpp).
enum class comm_backend : uint8_t {
  ring,  ///< the ZeroMQ ring all-reduce on the host (every dtype, bit-identical results on every node)
  nccl,  ///< NCCL on each node's GPU (fp32, fp16, bf16); only in a build with LONGWAVE_WITH_NCCL
};
template <>
struct enum_names<comm_backend> {
  static constexpr std::array<const char*, 2> names{"ring", "nccl"};
};

/// The TOML name of a config enum value, e.g. to_string(run_mode::ddp) is "ddp"; "invalid" for a number
/// outside the enum.
template <class E, class = std::enable_if_t<is_config_enum_v<E>>>
constexpr const char* to_string(E e) {
  const auto i = static_cast<size_t>(e);
  return i < enum_names<E>::names.size() ? enum_names<E>::names[i] : "invalid";
}

/// The value named `name` (exact, lower case), e.g. from_string<run_mode>("ddp"); nullopt for anything else.
template <class E, class = std::enable_if_t<is_config_enum_v<E>>>
constexpr std::optional<E> from_string(std::string_view name) {
  for (size_t i = 0; i < enum_names<E>::names.size(); ++i) {
    if (name == enum_names<E>::names[i]) return static_cast<E>(i);
  }
  return std::nullopt;
}

/// [run]: what to train and where to write it.
struct run_section {
  run_mode mode = run_mode::diloco;  ///< "diloco" | "single" | "ddp"
  uint64_t seed = 1234;
  std::string out_dir = "runs/default";  ///< checkpoints, loss trace, resolved config
  std::string name = "";                 ///< label for logs and metrics; defaults to the config file stem
};

/// [model]: which Llama-style preset, its shape overrides and the precision.
struct model_section {
  std::string preset = "tiny";            ///< "tiny" | "small" | "150m" | "1b"
  int64_t dim = 0;                        ///< model width; 0: the preset's (config/model_shape.hpp)
  int64_t layers = 0;                     ///< decoder layers; 0: the preset's
  int64_t heads = 0;                      ///< attention heads, must divide dim; 0: the preset's
  int64_t kv_heads = 0;                   ///< key/value heads, must divide heads; 0: the preset's
  int64_t ffn_hidden = 0;                 ///< SwiGLU hidden width; 0: the preset's
  model_dtype dtype = model_dtype::fp32;  ///< "fp32" | "bf16"
  int64_t seq_len = 128;                  ///< training context T
  int64_t vocab_size = 0;                 ///< 0: take it from the tokenizer
};

/// [data]: corpus, tokenizer and shards.
struct data_section {
  std::string path =
      "";  ///< "" = bundled KJV; a .txt, a .jsonl (field "text") or a dir with train.bin/val.bin
  tokenizer_kind tokenizer = tokenizer_kind::byte;  ///< "byte" | "bpe"
  int64_t bpe_vocab_size = 1024;                    ///< only for tokenizer = "bpe"; 257..65535
  double val_fraction = 0.05;                       ///< share of the corpus held out for validation, (0, 0.5]
  std::string cache_dir = "";                       ///< "" = <out_dir>/data
  data_partition partition = data_partition::contiguous;  ///< how the train tokens are split among workers
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
  int64_t threads = 0;     ///< torch threads per worker; 0 = usable CPUs (or OMP_NUM_THREADS) / workers
  /// Where the inner steps run: "cpu", "cuda" (workers round-robin over the visible GPUs), "cuda:N" or
  /// "auto" (cuda when a GPU is visible, else cpu). Per node in a cluster file; not part of the training
  /// fingerprint, so a cluster may mix CPU and GPU nodes.
  std::string device = "cpu";
  autocast_mode autocast = autocast_mode::automatic;
  /// Each inner step's batch_size sequences as this many micro-batches whose gradients add up (a divisor of
  /// batch_size): the step is the same, its activations 1/micro_batches the size. Per node, like device.
  int64_t micro_batches = 1;
  /// Deterministic kernels and no TF32: a resumed run continues identically on the same GPU. Per node.
  bool deterministic = false;
  /// Nodes of chosen speeds, for experiments and tests: each inner step takes pace_step_s / speed seconds
  /// (the worker waits out what its compute leaves; a step slower than that is named). 0: as fast as the
  /// device. speed is per node in a cluster file; neither is part of the training fingerprint.
  double pace_step_s = 0;
  double speed = 1;
  /// The paced time of one inner step (0: not paced).
  double paced_step_s() const { return pace_step_s > 0 ? pace_step_s / speed : 0.0; }
};

/// [outer]: the outer optimizer, SGD with Nesterov momentum.
struct outer_section {
  double lr = 0.7;
  /// In (-1, 1). A negative momentum (with nesterov = false) counters the momentum-like effect of a stale
  /// average under diloco.outer = "delayed" or "eager" (docs/02-policies.md, "The round and the DiLoCo
  /// step").
  double momentum = 0.9;
  bool nesterov = true;
};

/// [diloco]: when the averaged pseudo-gradient is applied (docs/02-policies.md).
struct diloco_section {
  outer_policy_kind outer =
      outer_policy_kind::sync;  ///< "sync" | "delayed" | "eager" | "streaming" | "async"
  int64_t fragments = 2;        ///< streaming: P, fragments of layers (at most the model's layers)
  fragment_layout fragment_pattern = fragment_layout::strided;  ///< streaming: "strided" | "sequential"
  int64_t tau = 1;     ///< streaming: inner steps each fragment's all-reduce overlaps (< inner_steps / P)
  double alpha = 0.5;  ///< streaming: theta_f <- (1 - alpha) * theta_f^global + alpha * theta_f^local
  /// Dynamic local updates (sync, delayed, eager): each node runs the inner steps that fit in the fastest
  /// node's H-step time (measured), at least min_steps; the average weights each node by its tokens, and the
  /// learning-rate schedule advances by a step's share of its round.
  bool adaptive_steps = false;
  int64_t min_steps = 0;  ///< adaptive_steps' floor; 0: train.inner_steps / 8 (at least 1)
  /// The floor of a node's inner steps under adaptive_steps, for H = train.inner_steps.
  int64_t step_floor(int64_t h) const {
    return min_steps > 0 ? std::min(min_steps, h) : std::max<int64_t>(1, h / 8);
  }
};

/// [async]: diloco.outer = "async" (docs/02-policies.md, "Asynchronous outer steps"). train.rounds counts
/// versions (merges), the outer steps of the cluster.
struct async_section {
  int64_t quorum = 1;         ///< contributions that open a merge's grace window (at most the live nodes)
  double grace_min_s = 0;     ///< the grace window's least length once the quorum is in
  double grace_max_s = 5;     ///< its longest: a node not due within it is not waited for
  int64_t max_staleness = 4;  ///< a contribution started more than this many versions ago is dropped
  /// Merges announced, none of whose all-reduces is over yet, before the next may close (0: any number).
  int64_t max_in_flight = 1;
  /// A node takes a version applied during its phase in after every this many inner steps: its workers'
  /// weights move with theta and the pseudo-gradient counts from the newer version (0: whole phases).
  int64_t rebase_steps = 1;
  /// Delayed Nesterov: each contribution applies at once without momentum, theta -= lr * delta / dn_period,
  /// and the outer momentum takes the buffered contributions' mean once dn_period of them have come; 1:
  /// Nesterov at every merge of one; 0: twice the cluster's nodes (half a round's step per round of
  /// contributions: steadier than a whole one on stale pseudo-gradients, bench/RESULTS.md).
  int64_t dn_period = 0;
  age_scaling_kind age_scaling = age_scaling_kind::none;  ///< "none" | "cgad"
  double cgad_alpha = 0.1;                                ///< cgad: exp(-alpha * staleness)
  int64_t cgad_cutoff = 8;  ///< cgad: the staleness at which a contribution's weight reaches 0
  /// The run ends at the first merge that brings the merged tokens to this many (0: at train.rounds
  /// versions only).
  int64_t tokens = 0;
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
  wire_dtype dtype = wire_dtype::fp32;  ///< wire element type: "fp32" | "fp16" | "bf16" | "int8" | "sparse"
  double density = 0.0156;              ///< sparse: kept fraction of each sparse_chunk (top-k by magnitude)
  int64_t value_bits = 2;               ///< sparse: bits per kept value (sign + magnitude level): 2 or 4
  int64_t sparse_chunk = 4096;          ///< sparse: values per top-k chunk (each has its own scale)
  sparse_index_mode sparse_indices = sparse_index_mode::topk;  ///< sparse: "topk" | "shared"
  double ef_decay = 0.95;       ///< sparse: error feedback e <- ef_decay * e + delta (always on for sparse)
  bool robust_clip = false;     ///< sparse: scale each node's contribution down to the round's median norm
  bool int8_codebook = false;   ///< int8 only: 256-bin codebook of bin means instead of one scale per chunk
  bool error_feedback = false;  ///< carry this node's quantization residual into the next round
  int64_t chunk_kib = 1024;     ///< payload of one ring chunk (pipelining granularity), KiB
  double timeout_s = 300;       ///< an all-reduce fails after this long without progress
  double link_timeout_s = 15;   ///< a ring link that delivers nothing this long is dropped (0: never)
  comm_backend backend = comm_backend::ring;  ///< "ring" | "nccl"
};

/// [federated]: client sampling (Photon, Sani et al. 2025): the workers are clients, and each round only a
/// seeded draw of them trains and is averaged; the others idle.
struct federated_section {
  int64_t clients_per_round = 0;  ///< K clients drawn per round out of all of them; 0: every client, always
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
  async_section async;
  federated_section federated;
  eval_section eval;
  checkpoint_section checkpoint;
  metrics_section metrics;
  comm_section comm;
  runtime_section runtime;
};

}  // namespace longwave::config

/// Config enums print as their TOML names in fmt::format and spdlog: fmt::format("{}", run_mode::ddp) is
/// "ddp".
namespace fmt {
template <class E>
struct formatter<E, char, std::enable_if_t<longwave::config::is_config_enum_v<E>>> : formatter<string_view> {
  template <class FormatContext>
  auto format(E e, FormatContext& ctx) const -> decltype(ctx.out()) {
    return formatter<string_view>::format(longwave::config::to_string(e), ctx);
  }
};
}  // namespace fmt
