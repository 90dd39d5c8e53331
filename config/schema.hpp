#pragma once
// The config schema: every field of train_config with its TOML section, key and rule, in one table
// (for_each_field). config/config_loader.cpp drives parsing, --set overrides, validation, error messages and
// to_toml from it.
//
// A field rule says which values a field accepts; each field uses the part for its type:
//   integers       ints(lo[, hi]), zero_or_ints(lo, hi)   "must be an integer in 8..8192"
//   doubles        real_in('(', 0, 1, ']'), real_at_least  "must be a finite number > 0 and <= 1"
//   bools          any()
//   strings        any(), non_empty(), one_of({...})       "allowed values are tiny, small, 150m, 1b"
//   config enums   listed(): the names of its enum_names   "allowed values are sync, delayed, eager, ..."
//
// To add a field: give it a default in its section of config/train_config.hpp, then add one line to
// for_each_field below, in struct order. The loader then reads it from TOML and --set, checks it, names it
// in errors (with "did you mean" for a misspelt key) and writes it in to_toml, so in every run's config.toml.
// A fixed set of choices is a config enum: an enum class with an enum_names table in train_config.hpp, and
// the rule listed(). Checks across several fields go in validate() (config_loader.cpp).
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::config {

/// A deadline becomes a nanosecond timespan downstream; int64 nanoseconds overflow past ~292 years.
inline constexpr double max_timeout_s = 1e9;
/// Sequences per worker per step: far beyond any machine's memory at the smallest context, and small enough
/// that the memory estimate (batch x context x per-token bytes x workers) cannot overflow.
inline constexpr int64_t max_batch_size = int64_t{1} << 20;

/// What one field accepts. One struct for every kind; each field uses the part for its type.
struct rule {
  int64_t int_lo = std::numeric_limits<int64_t>::min();
  int64_t int_hi = std::numeric_limits<int64_t>::max();
  bool zero_ok = false;  ///< integers: 0 is allowed besides [int_lo, int_hi]
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  std::vector<std::string_view> allowed;  ///< strings: the allowed values; empty = any string
  bool non_empty = false;                 ///< strings: "" is refused
};

/// Any value of the field's type (a bool, a string).
inline rule any() {
  return {};
}

/// A config enum field: exactly the names in its enum_names table (train_config.hpp).
inline rule listed() {
  return {};
}

/// An integer in [lo, hi].
inline rule ints(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) {
  rule r;
  r.int_lo = lo;
  r.int_hi = hi;
  return r;
}

/// 0 (an "off" or "automatic" value) or an integer in [lo, hi].
inline rule zero_or_ints(int64_t lo, int64_t hi) {
  rule r = ints(lo, hi);
  r.zero_ok = true;
  return r;
}

/// A finite real in an interval written as in maths: real_in('(', 0, 1, ']') is (0, 1].
inline rule real_in(char open, double lo, double hi, char close) {
  rule r;
  r.lo = lo;
  r.hi = hi;
  r.lo_open = open == '(';
  r.hi_open = close == ')';
  return r;
}

/// A finite real >= lo.
inline rule real_at_least(double lo) {
  return real_in('[', lo, std::numeric_limits<double>::infinity(), ')');
}

/// A string field that takes one of `values` (for a fixed set, prefer a config enum and listed()).
inline rule one_of(std::initializer_list<std::string_view> values) {
  rule r;
  r.allowed = values;
  return r;
}

/// A string that must not be empty.
inline rule non_empty() {
  rule r;
  r.non_empty = true;
  return r;
}

/// Calls f(section, name, field, rule) for every field of every section, in struct order (the order of
/// to_toml and of validation). This is the one place that lists the fields: keep it in step with
/// config/train_config.hpp. Config is train_config or const train_config.
template <class Config, class Visitor>
void for_each_field(Config& c, Visitor&& f) {
  f("run", "mode", c.run.mode, listed());
  f("run", "seed", c.run.seed, ints(0));
  f("run", "out_dir", c.run.out_dir, non_empty());
  f("run", "name", c.run.name, any());

  f("model", "preset", c.model.preset, one_of({"tiny", "small", "150m", "1b"}));
  // Shape overrides, 0 = the preset's value; validate() checks they fit together (config/model_shape.hpp).
  f("model", "dim", c.model.dim, zero_or_ints(8, 16384));
  f("model", "layers", c.model.layers, zero_or_ints(1, 256));
  f("model", "heads", c.model.heads, zero_or_ints(1, 256));
  f("model", "kv_heads", c.model.kv_heads, zero_or_ints(1, 256));
  f("model", "ffn_hidden", c.model.ffn_hidden, zero_or_ints(8, 65536));
  f("model", "dtype", c.model.dtype, listed());
  f("model", "seq_len", c.model.seq_len, ints(8, 8192));
  f("model", "vocab_size", c.model.vocab_size, zero_or_ints(2, 65536));

  f("data", "path", c.data.path, any());
  f("data", "tokenizer", c.data.tokenizer, listed());
  f("data", "bpe_vocab_size", c.data.bpe_vocab_size, ints(257, 65535));
  f("data", "val_fraction", c.data.val_fraction, real_in('(', 0, 0.5, ']'));
  f("data", "cache_dir", c.data.cache_dir, any());
  f("data", "partition", c.data.partition, listed());

  f("train", "workers", c.train.workers, ints(1, 256));
  f("train", "inner_steps", c.train.inner_steps, ints(1));
  f("train", "rounds", c.train.rounds, ints(1));
  f("train", "batch_size", c.train.batch_size, ints(1, max_batch_size));
  f("train", "lr", c.train.lr, real_in('(', 0, 10, ']'));
  f("train", "warmup_steps", c.train.warmup_steps, ints(0));
  f("train", "min_lr_ratio", c.train.min_lr_ratio, real_in('[', 0, 1, ']'));
  // Decoupled decay multiplies the weights by 1 - lr * weight_decay each step: usual values are 0 to 0.1; a
  // huge one flips and blows up the weights (1e300 trained to NaN).
  f("train", "weight_decay", c.train.weight_decay, real_in('[', 0, 1, ']'));
  f("train", "beta1", c.train.beta1, real_in('[', 0, 1, ')'));
  f("train", "beta2", c.train.beta2, real_in('[', 0, 1, ')'));
  // eps is added to a float tensor: below ~1e-38 it rounds to 0 (0/0 for a parameter that never had a
  // gradient); above 1e-2 it swamps the second moment and AdamW stops adapting.
  f("train", "eps", c.train.eps, real_in('[', 1e-30, 1e-2, ']'));
  f("train", "grad_clip", c.train.grad_clip, real_at_least(0));
  f("train", "threads", c.train.threads, ints(0, 1024));
  f("train", "device", c.train.device, non_empty());  // its form is checked in validate()
  f("train", "autocast", c.train.autocast, listed());
  f("train", "micro_batches", c.train.micro_batches, ints(1, max_batch_size));  // a divisor: validate()
  f("train", "deterministic", c.train.deterministic, any());
  f("train", "pace_step_s", c.train.pace_step_s, real_in('[', 0, 3600, ']'));
  f("train", "speed", c.train.speed, real_in('(', 0, 1000, ']'));

  // The outer step scales a float tensor by lr: as for train.lr, past 10 it only diverges (and past ~3e38
  // it no longer converts to float).
  f("outer", "lr", c.outer.lr, real_in('(', 0, 10, ']'));
  f("outer", "momentum", c.outer.momentum, real_in('(', -1, 1, ')'));
  f("outer", "nesterov", c.outer.nesterov, any());

  f("diloco", "outer", c.diloco.outer, listed());
  f("diloco", "fragments", c.diloco.fragments, ints(1, 1024));
  f("diloco", "fragment_pattern", c.diloco.fragment_pattern, listed());
  f("diloco", "tau", c.diloco.tau, ints(0));
  f("diloco", "alpha", c.diloco.alpha, real_in('[', 0, 1, ']'));
  f("diloco", "adaptive_steps", c.diloco.adaptive_steps, any());
  f("diloco", "min_steps", c.diloco.min_steps, ints(0));  // at most train.inner_steps: validate()

  f("async", "quorum", c.async.quorum, ints(1, 65536));
  f("async", "grace_min_s", c.async.grace_min_s, real_in('[', 0, 3600, ']'));  // <= grace_max_s: validate()
  f("async", "grace_max_s", c.async.grace_max_s, real_in('[', 0, 3600, ']'));
  f("async", "max_staleness", c.async.max_staleness, ints(0, 1000000));
  f("async", "max_in_flight", c.async.max_in_flight, ints(0, 1000));
  f("async", "rebase_steps", c.async.rebase_steps, ints(0, 1000000));
  f("async", "dn_period", c.async.dn_period, ints(0, 1000000));
  f("async", "age_scaling", c.async.age_scaling, listed());
  f("async", "cgad_alpha", c.async.cgad_alpha, real_in('[', 0, 100, ']'));
  f("async", "cgad_cutoff", c.async.cgad_cutoff, ints(1, 1000000));
  f("async", "tokens", c.async.tokens, ints(0));

  f("federated", "clients_per_round", c.federated.clients_per_round, ints(0, 65536));

  f("eval", "every_rounds", c.eval.every_rounds, ints(0));
  f("eval", "batches", c.eval.batches, ints(1));
  f("eval", "async", c.eval.async, any());

  f("checkpoint", "every_rounds", c.checkpoint.every_rounds, ints(0));
  f("checkpoint", "keep", c.checkpoint.keep, ints(1));
  f("checkpoint", "dir", c.checkpoint.dir, any());
  f("checkpoint", "max_failed_writes", c.checkpoint.max_failed_writes, ints(0, 1000));

  f("metrics", "enabled", c.metrics.enabled, any());
  f("metrics", "port", c.metrics.port, ints(0, 65535));
  f("metrics", "address", c.metrics.address, non_empty());

  f("comm", "dtype", c.comm.dtype, listed());
  f("comm", "density", c.comm.density, real_in('(', 0, 1, ']'));
  f("comm", "value_bits", c.comm.value_bits, ints(2, 4));
  f("comm", "sparse_chunk", c.comm.sparse_chunk, ints(1, int64_t{1} << 24));
  f("comm", "sparse_indices", c.comm.sparse_indices, listed());
  f("comm", "ef_decay", c.comm.ef_decay, real_in('[', 0, 1, ']'));
  f("comm", "robust_clip", c.comm.robust_clip, any());
  f("comm", "int8_codebook", c.comm.int8_codebook, any());
  f("comm", "error_feedback", c.comm.error_feedback, any());
  f("comm", "chunk_kib", c.comm.chunk_kib, ints(1, 65536));
  f("comm", "timeout_s", c.comm.timeout_s, real_in('(', 0, max_timeout_s, ']'));
  f("comm", "link_timeout_s", c.comm.link_timeout_s, real_in('[', 0, max_timeout_s, ']'));
  f("comm", "backend", c.comm.backend, listed());

  f("runtime", "round_timeout_s", c.runtime.round_timeout_s, real_in('(', 0, max_timeout_s, ']'));
  f("runtime", "request_timeout_s", c.runtime.request_timeout_s, real_in('(', 0, max_timeout_s, ']'));
  f("runtime", "log_every_steps", c.runtime.log_every_steps, ints(1));
}

}  // namespace longwave::config
