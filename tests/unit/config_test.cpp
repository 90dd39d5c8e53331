// Unit tests for config/config_loader: defaults, a full file, --set overrides, the to_toml round trip and one
// clear error (naming the dotted key) for each kind of bad config.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "config/inert_settings.hpp"
#include "config/model_shape.hpp"

using Catch::Matchers::Contains;
using longwave::config::age_scaling_kind;
using longwave::config::autocast_mode;
using longwave::config::comm_backend;
using longwave::config::config_error;
using longwave::config::fragment_layout;
using longwave::config::load_config_file;
using longwave::config::model_dtype;
using longwave::config::outer_policy_kind;
using longwave::config::parse_config;
using longwave::config::run_mode;
using longwave::config::settings_differences;
using longwave::config::sparse_index_mode;
using longwave::config::to_toml;
using longwave::config::tokenizer_kind;
using longwave::config::train_config;
using longwave::config::training_fingerprint;
using longwave::config::training_settings;
using longwave::config::validate;
using longwave::config::wire_dtype;

namespace {

/// Field-by-field equality, doubles compared exactly.
bool same(const train_config& a, const train_config& b) {
  return a.run.mode == b.run.mode && a.run.seed == b.run.seed && a.run.out_dir == b.run.out_dir &&
         a.run.name == b.run.name && a.model.preset == b.model.preset && a.model.dim == b.model.dim &&
         a.model.layers == b.model.layers && a.model.heads == b.model.heads &&
         a.model.kv_heads == b.model.kv_heads && a.model.ffn_hidden == b.model.ffn_hidden &&
         a.model.dtype == b.model.dtype && a.model.seq_len == b.model.seq_len &&
         a.model.vocab_size == b.model.vocab_size && a.data.path == b.data.path &&
         a.data.tokenizer == b.data.tokenizer && a.data.bpe_vocab_size == b.data.bpe_vocab_size &&
         a.data.val_fraction == b.data.val_fraction && a.data.cache_dir == b.data.cache_dir &&
         a.train.workers == b.train.workers && a.train.inner_steps == b.train.inner_steps &&
         a.train.rounds == b.train.rounds && a.train.batch_size == b.train.batch_size &&
         a.train.lr == b.train.lr && a.train.warmup_steps == b.train.warmup_steps &&
         a.train.min_lr_ratio == b.train.min_lr_ratio && a.train.weight_decay == b.train.weight_decay &&
         a.train.beta1 == b.train.beta1 && a.train.beta2 == b.train.beta2 && a.train.eps == b.train.eps &&
         a.train.grad_clip == b.train.grad_clip && a.train.threads == b.train.threads &&
         a.outer.lr == b.outer.lr && a.outer.momentum == b.outer.momentum &&
         a.outer.nesterov == b.outer.nesterov && a.diloco.outer == b.diloco.outer &&
         a.diloco.fragments == b.diloco.fragments && a.diloco.fragment_pattern == b.diloco.fragment_pattern &&
         a.diloco.tau == b.diloco.tau && a.diloco.alpha == b.diloco.alpha &&
         a.diloco.adaptive_steps == b.diloco.adaptive_steps && a.diloco.min_steps == b.diloco.min_steps &&
         a.eval.every_rounds == b.eval.every_rounds && a.eval.batches == b.eval.batches &&
         a.eval.async == b.eval.async && a.checkpoint.every_rounds == b.checkpoint.every_rounds &&
         a.checkpoint.keep == b.checkpoint.keep && a.checkpoint.dir == b.checkpoint.dir &&
         a.metrics.enabled == b.metrics.enabled && a.metrics.port == b.metrics.port &&
         a.metrics.address == b.metrics.address && a.runtime.round_timeout_s == b.runtime.round_timeout_s &&
         a.runtime.request_timeout_s == b.runtime.request_timeout_s &&
         a.runtime.log_every_steps == b.runtime.log_every_steps && a.comm.dtype == b.comm.dtype &&
         a.comm.int8_codebook == b.comm.int8_codebook && a.comm.error_feedback == b.comm.error_feedback &&
         a.comm.chunk_kib == b.comm.chunk_kib && a.comm.timeout_s == b.comm.timeout_s &&
         a.comm.backend == b.comm.backend && a.comm.sparse_indices == b.comm.sparse_indices;
}

/// The config_error that parse_config throws for this input; fails the test if it throws nothing.
config_error error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, overrides, "test.toml");
  } catch (const config_error& e) {
    CATCH_INFO("message: " << e.what());
    CATCH_CHECK(std::string(e.what()).rfind("config error: ", 0) == 0);
    CATCH_CHECK(std::string(e.what()).find('\n') == std::string::npos);
    return e;
  }
  CATCH_FAIL("parse_config accepted a bad config: " << text);
  return config_error("", "");
}

/// The config_error that validate throws for this struct.
config_error validate_error(const train_config& cfg) {
  try {
    validate(cfg);
  } catch (const config_error& e) {
    return e;
  }
  CATCH_FAIL("validate accepted a bad config");
  return config_error("", "");
}

const char* const full_file = R"(# every field, none at its default
[run]
mode = "ddp"
seed = 42
out_dir = "/tmp/lw-run"
name = "full"

[model]
preset = "small"
dim = 512
layers = 6
heads = 8
kv_heads = 2
ffn_hidden = 1536
dtype = "bf16"
seq_len = 256
vocab_size = 4096

[data]
path = "corpus.jsonl"
tokenizer = "bpe"
bpe_vocab_size = 4000
val_fraction = 0.1
cache_dir = "/tmp/lw-cache"

[train]
workers = 8
inner_steps = 100
rounds = 20
batch_size = 16
lr = 3e-4
warmup_steps = 200
min_lr_ratio = 0.05
weight_decay = 0.01
beta1 = 0.85
beta2 = 0.99
eps = 1e-6
grad_clip = 0.5
threads = 2

[outer]
lr = 0.5
momentum = 0.8
nesterov = false

[diloco]
outer = "sync"
fragments = 4
fragment_pattern = "sequential"
tau = 2
alpha = 0.25
min_steps = 3

[eval]
every_rounds = 2
batches = 4
async = false

[checkpoint]
every_rounds = 3
keep = 5
dir = "/tmp/lw-ckpt"

[metrics]
enabled = false
port = 0
address = "0.0.0.0"

[comm]
dtype = "int8"
int8_codebook = true
error_feedback = true
chunk_kib = 256
timeout_s = 45.5

[runtime]
round_timeout_s = 600
request_timeout_s = 30.5
log_every_steps = 1
)";

}  // namespace

CATCH_TEST_CASE("Empty text gives the struct defaults", "[config]") {
  const train_config cfg = parse_config("", {}, "empty.toml");
  CATCH_CHECK(same(cfg, train_config{}));
  CATCH_CHECK(cfg.train.workers == 4);
  CATCH_CHECK(cfg.run.mode == run_mode::diloco);
}

CATCH_TEST_CASE("The struct defaults are themselves valid", "[config]") {
  CATCH_CHECK_NOTHROW(validate(train_config{}));
}

CATCH_TEST_CASE("A full file sets every field of every section", "[config]") {
  const train_config c = parse_config(full_file, {}, "full.toml");
  CATCH_CHECK(c.run.mode == run_mode::ddp);
  CATCH_CHECK(c.run.seed == 42);
  CATCH_CHECK(c.run.out_dir == "/tmp/lw-run");
  CATCH_CHECK(c.run.name == "full");
  CATCH_CHECK(c.model.preset == "small");
  CATCH_CHECK(c.model.dim == 512);
  CATCH_CHECK(c.model.layers == 6);
  CATCH_CHECK(c.model.heads == 8);
  CATCH_CHECK(c.model.kv_heads == 2);
  CATCH_CHECK(c.model.ffn_hidden == 1536);
  CATCH_CHECK(c.model.dtype == model_dtype::bf16);
  CATCH_CHECK(c.model.seq_len == 256);
  CATCH_CHECK(c.model.vocab_size == 4096);
  CATCH_CHECK(c.data.path == "corpus.jsonl");
  CATCH_CHECK(c.data.tokenizer == tokenizer_kind::bpe);
  CATCH_CHECK(c.data.bpe_vocab_size == 4000);
  CATCH_CHECK(c.data.val_fraction == 0.1);
  CATCH_CHECK(c.data.cache_dir == "/tmp/lw-cache");
  CATCH_CHECK(c.train.workers == 8);
  CATCH_CHECK(c.train.inner_steps == 100);
  CATCH_CHECK(c.train.rounds == 20);
  CATCH_CHECK(c.train.batch_size == 16);
  CATCH_CHECK(c.train.lr == 3e-4);
  CATCH_CHECK(c.train.warmup_steps == 200);
  CATCH_CHECK(c.train.min_lr_ratio == 0.05);
  CATCH_CHECK(c.train.weight_decay == 0.01);
  CATCH_CHECK(c.train.beta1 == 0.85);
  CATCH_CHECK(c.train.beta2 == 0.99);
  CATCH_CHECK(c.train.eps == 1e-6);
  CATCH_CHECK(c.train.grad_clip == 0.5);
  CATCH_CHECK(c.train.threads == 2);
  CATCH_CHECK(c.outer.lr == 0.5);
  CATCH_CHECK(c.outer.momentum == 0.8);
  CATCH_CHECK(c.outer.nesterov == false);
  CATCH_CHECK(c.eval.every_rounds == 2);
  CATCH_CHECK(c.eval.batches == 4);
  CATCH_CHECK(c.eval.async == false);
  CATCH_CHECK(c.diloco.outer == outer_policy_kind::sync);  // ddp takes no overlap policy
  CATCH_CHECK(c.diloco.fragments == 4);
  CATCH_CHECK(c.diloco.fragment_pattern == fragment_layout::sequential);
  CATCH_CHECK(c.diloco.tau == 2);
  CATCH_CHECK(c.diloco.alpha == 0.25);
  CATCH_CHECK(c.diloco.min_steps == 3);
  CATCH_CHECK(c.checkpoint.every_rounds == 3);
  CATCH_CHECK(c.checkpoint.keep == 5);
  CATCH_CHECK(c.checkpoint.dir == "/tmp/lw-ckpt");
  CATCH_CHECK(c.metrics.enabled == false);
  CATCH_CHECK(c.metrics.port == 0);
  CATCH_CHECK(c.metrics.address == "0.0.0.0");
  CATCH_CHECK(c.comm.dtype == wire_dtype::int8);
  CATCH_CHECK(c.comm.int8_codebook == true);
  CATCH_CHECK(c.comm.error_feedback == true);
  CATCH_CHECK(c.comm.chunk_kib == 256);
  CATCH_CHECK(c.comm.timeout_s == 45.5);
  CATCH_CHECK(c.runtime.round_timeout_s == 600.0);
  CATCH_CHECK(c.runtime.request_timeout_s == 30.5);
  CATCH_CHECK(c.runtime.log_every_steps == 1);
}

CATCH_TEST_CASE("Fields missing from the file keep their defaults", "[config]") {
  const train_config c = parse_config("[train]\nworkers = 2\n", {}, "partial.toml");
  train_config expected;
  expected.train.workers = 2;
  CATCH_CHECK(same(c, expected));
}

CATCH_TEST_CASE("TOML dotted keys at the top level are the same as a section", "[config]") {
  const train_config c = parse_config("train.workers = 3\nouter.lr = 1\n", {}, "dotted.toml");
  CATCH_CHECK(c.train.workers == 3);
  CATCH_CHECK(c.outer.lr == 1.0);
}

CATCH_TEST_CASE("Overrides set integer, double, string and bool fields", "[config]") {
  const train_config c = parse_config(
      "",
      {"train.workers=2", "train.lr=1e-3", "model.preset=small", "run.out_dir=/tmp/x", "outer.nesterov=false",
       "train.min_lr_ratio=0", "model.dtype=\"bf16\"", "metrics.port = 8080"},
      "");
  CATCH_CHECK(c.train.workers == 2);
  CATCH_CHECK(c.train.lr == 1e-3);
  CATCH_CHECK(c.model.preset == "small");
  CATCH_CHECK(c.run.out_dir == "/tmp/x");
  CATCH_CHECK(c.outer.nesterov == false);
  CATCH_CHECK(c.train.min_lr_ratio == 0.0);
  CATCH_CHECK(c.model.dtype == model_dtype::bf16);
  CATCH_CHECK(c.metrics.port == 8080);
}

CATCH_TEST_CASE("String overrides take values that are not TOML strings as raw text", "[config]") {
  // 150m and 1b are not valid TOML; 2024 and true are TOML, but the fields are strings.
  CATCH_CHECK(parse_config("", {"model.preset=150m"}, "").model.preset == "150m");
  CATCH_CHECK(parse_config("", {"model.preset=1b"}, "").model.preset == "1b");
  CATCH_CHECK(parse_config("", {"run.name=2024"}, "").run.name == "2024");
  CATCH_CHECK(parse_config("", {"run.name=true"}, "").run.name == "true");
  CATCH_CHECK(parse_config("", {"run.name="}, "").run.name == "");
  CATCH_CHECK(parse_config("", {"data.path=a b=c.txt"}, "").data.path == "a b=c.txt");
}

CATCH_TEST_CASE("Overrides win over the file and later overrides win over earlier ones", "[config]") {
  const train_config c =
      parse_config("[train]\nworkers = 8\nlr = 0.01\n", {"train.workers=2", "train.workers=3"}, "f.toml");
  CATCH_CHECK(c.train.workers == 3);
  CATCH_CHECK(c.train.lr == 0.01);
}

CATCH_TEST_CASE("An override can repair a value that is invalid in the file", "[config]") {
  const train_config c = parse_config("[run]\nmode = \"single\"\n", {"train.workers=1"}, "f.toml");
  CATCH_CHECK(c.run.mode == run_mode::single);
  CATCH_CHECK(c.train.workers == 1);
}

CATCH_TEST_CASE("A double field accepts a TOML integer", "[config]") {
  const train_config c = parse_config("[runtime]\nround_timeout_s = 60\n[train]\nlr = 1\n", {}, "");
  CATCH_CHECK(c.runtime.round_timeout_s == 60.0);
  CATCH_CHECK(c.train.lr == 1.0);
}

CATCH_TEST_CASE("to_toml round-trips the default config exactly", "[config]") {
  const train_config c;
  const std::string text = to_toml(c);
  CATCH_CHECK(same(parse_config(text, {}, ""), c));
  CATCH_CHECK(to_toml(parse_config(text, {}, "")) == text);
}

CATCH_TEST_CASE("to_toml round-trips awkward doubles and strings exactly", "[config]") {
  train_config c = parse_config(full_file, {}, "full.toml");
  c.train.lr = std::numeric_limits<double>::denorm_min();
  c.diloco.alpha = 0.1 + 0.2;  // 0.30000000000000004
  c.train.eps = std::nextafter(1e-30, 1.0);
  c.train.beta1 = 1.0 / 3.0;
  c.train.weight_decay = std::nextafter(1.0, 0.0);
  c.train.grad_clip = 1e300;
  c.outer.lr = 1.23456789123456789;
  c.runtime.round_timeout_s = 3600.0;
  c.data.val_fraction = std::nextafter(0.5, 0.0);
  c.run.seed = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  c.run.name = "quote \" backslash \\ unicode \xc3\xa9\xe2\x82\xac";
  c.data.path = "C:\\data\\'single'.txt";
  c.checkpoint.dir = "";
  const std::string text = to_toml(c);
  CATCH_INFO(text);
  CATCH_CHECK(same(parse_config(text, {}, ""), c));
  // Control characters are escaped too (the loader refuses them in a name; to_toml writes any string).
  auto d = c;
  d.run.name = "tab \t newline \n bell \x07 del \x7f";
  CATCH_CHECK_THAT(to_toml(d), Contains(R"(name = "tab \t newline \n bell \u0007 del \u007F")"));
}

CATCH_TEST_CASE("to_toml writes every section and every field in struct order", "[config]") {
  const std::string text = to_toml(train_config{});
  const std::vector<std::string> in_order = {"[run]",
                                             "mode = \"diloco\"",
                                             "seed = 1234",
                                             "out_dir = \"runs/default\"",
                                             "name = \"\"",
                                             "[model]",
                                             "preset = \"tiny\"",
                                             "dim = 0",
                                             "layers = 0",
                                             "heads = 0",
                                             "kv_heads = 0",
                                             "ffn_hidden = 0",
                                             "dtype = \"fp32\"",
                                             "seq_len = 128",
                                             "vocab_size = 0",
                                             "[data]",
                                             "path = \"\"",
                                             "tokenizer",
                                             "bpe_vocab_size = 1024",
                                             "val_fraction = 0.05",
                                             "cache_dir",
                                             "[train]",
                                             "workers = 4",
                                             "inner_steps = 50",
                                             "rounds = 10",
                                             "batch_size = 8",
                                             "lr = 0.004",
                                             "warmup_steps = 50",
                                             "min_lr_ratio = 0.1",
                                             "weight_decay",
                                             "beta1 = 0.9",
                                             "beta2 = 0.95",
                                             "eps = 1e-08",
                                             "grad_clip = 1.0",
                                             "threads = 0",
                                             "device = \"cpu\"",
                                             "autocast = \"auto\"",
                                             "[outer]",
                                             "lr = 0.7",
                                             "momentum = 0.9",
                                             "nesterov = true",
                                             "[diloco]",
                                             "outer = \"sync\"",
                                             "fragments = 2",
                                             "fragment_pattern = \"strided\"",
                                             "tau = 1",
                                             "alpha = 0.5",
                                             "adaptive_steps = false",
                                             "min_steps = 0",
                                             "[async]",
                                             "quorum = 1",
                                             "grace_min_s = 0.0",
                                             "grace_max_s = 5.0",
                                             "max_staleness = 4",
                                             "dn_period = 0",
                                             "age_scaling = \"none\"",
                                             "cgad_alpha = 0.1",
                                             "cgad_cutoff = 8",
                                             "tokens = 0",
                                             "[eval]",
                                             "every_rounds = 5",
                                             "batches = 16",
                                             "async = true",
                                             "[checkpoint]",
                                             "every_rounds = 1",
                                             "keep = 3",
                                             "dir = \"\"",
                                             "[metrics]",
                                             "enabled = true",
                                             "port = 9464",
                                             "address = \"127.0.0.1\"",
                                             "[comm]",
                                             "dtype = \"fp32\"",
                                             "int8_codebook = false",
                                             "error_feedback = false",
                                             "chunk_kib = 1024",
                                             "timeout_s = 300.0",
                                             "backend = \"ring\"",
                                             "[runtime]",
                                             "round_timeout_s = 3600.0",
                                             "request_timeout_s = 120.0",
                                             "log_every_steps = 10"};
  size_t pos = 0;
  for (const auto& piece : in_order) {
    CATCH_INFO("looking for " << piece << " after offset " << pos);
    const size_t found = text.find(piece, pos);
    CATCH_REQUIRE(found != std::string::npos);
    pos = found + piece.size();
  }
}

CATCH_TEST_CASE("An unknown key in a known section is named in full", "[config]") {
  const config_error e = error_of("[train]\nfoo = 1\n");
  CATCH_CHECK(e.key() == "train.foo");
  CATCH_CHECK_THAT(e.what(), Contains("unknown key 'train.foo'"));
  CATCH_CHECK_THAT(e.what(), Contains("test.toml:2:"));
}

CATCH_TEST_CASE("An unknown section is named and a close one is suggested", "[config]") {
  const config_error e = error_of("[trian]\nworkers = 2\n");
  CATCH_CHECK(e.key() == "trian");
  CATCH_CHECK_THAT(e.what(), Contains("unknown section [trian]"));
  CATCH_CHECK_THAT(e.what(), Contains("did you mean 'train'?"));
  const config_error far = error_of("[wibble]\nx = 1\n");
  CATCH_CHECK(far.key() == "wibble");
  CATCH_CHECK_THAT(far.what(), !Contains("did you mean"));
}

CATCH_TEST_CASE("A typo in a key gets a did-you-mean suggestion", "[config]") {
  const config_error e = error_of("[train]\nwrkers = 2\n");
  CATCH_CHECK(e.key() == "train.wrkers");
  CATCH_CHECK_THAT(e.what(), Contains("unknown key 'train.wrkers' (did you mean 'train.workers'?)"));
  const config_error swapped = error_of("[train]\ninenr_steps = 2\n");
  CATCH_CHECK_THAT(swapped.what(), Contains("did you mean 'train.inner_steps'?"));
}

CATCH_TEST_CASE("A key in the wrong section points to the right one", "[config]") {
  const config_error e = error_of("[train]\nmomentum = 0.5\n");
  CATCH_CHECK(e.key() == "train.momentum");
  CATCH_CHECK_THAT(e.what(), Contains("did you mean 'outer.momentum'?"));
  const config_error top = error_of("workers = 2\n");
  CATCH_CHECK(top.key() == "workers");
  CATCH_CHECK_THAT(top.what(), Contains("did you mean 'train.workers'?"));
}

CATCH_TEST_CASE("A section written as a value is rejected", "[config]") {
  const config_error e = error_of("train = 4\n");
  CATCH_CHECK(e.key() == "train");
  CATCH_CHECK_THAT(e.what(), Contains("expected a table [train], got an integer"));
}

CATCH_TEST_CASE("A string for an integer field names the key and both types", "[config]") {
  const config_error e = error_of("[train]\nworkers = \"four\"\n");
  CATCH_CHECK(e.key() == "train.workers");
  CATCH_CHECK_THAT(e.what(), Contains("train.workers = \"four\": expected an integer, got a string"));
}

CATCH_TEST_CASE("A float for an integer field is rejected", "[config]") {
  const config_error e = error_of("[train]\nbatch_size = 8.0\n");
  CATCH_CHECK(e.key() == "train.batch_size");
  CATCH_CHECK_THAT(e.what(),
                   Contains("expected an integer, got a float (write 8 without the decimal point)"));
  CATCH_CHECK_THAT(e.what(), Contains("train.batch_size = 8.0:"));  // as written (it showed "= 8")
  CATCH_CHECK_THAT(error_of("[train]\nbatch_size = 8.5\n").what(), !Contains("decimal point"));
}

CATCH_TEST_CASE("Booleans, strings and doubles accept only their own TOML types", "[config]") {
  const config_error b = error_of("[metrics]\nenabled = 1\n");
  CATCH_CHECK(b.key() == "metrics.enabled");
  CATCH_CHECK_THAT(b.what(), Contains("metrics.enabled = 1: expected a boolean"));
  const config_error s = error_of("[model]\npreset = 150\n");
  CATCH_CHECK(s.key() == "model.preset");
  CATCH_CHECK_THAT(s.what(), Contains("expected a string, got an integer"));
  const config_error d = error_of("[train]\nlr = \"fast\"\n");
  CATCH_CHECK(d.key() == "train.lr");
  CATCH_CHECK_THAT(d.what(), Contains("expected a number, got a string"));
  const config_error a = error_of("[train]\nworkers = [4]\n");
  CATCH_CHECK(a.key() == "train.workers");
  CATCH_CHECK_THAT(a.what(), Contains("got an array"));
  const config_error t = error_of("[train.workers]\nx = 1\n");
  CATCH_CHECK(t.key() == "train.workers");
  CATCH_CHECK_THAT(t.what(), Contains("got a table"));
}

CATCH_TEST_CASE("A bad enum value lists the allowed values", "[config]") {
  const config_error e = error_of("[model]\npreset = \"huge\"\n");
  CATCH_CHECK(e.key() == "model.preset");
  CATCH_CHECK_THAT(e.what(), Contains("model.preset = \"huge\": allowed values are tiny, small, 150m, 1b"));
  CATCH_CHECK_THAT(e.what(), Contains("test.toml:2:10"));
  CATCH_CHECK(error_of("[run]\nmode = \"DiLoCo\"\n").key() == "run.mode");
  CATCH_CHECK(error_of("[model]\ndtype = \"fp16\"\n").key() == "model.dtype");
  CATCH_CHECK(error_of("[data]\ntokenizer = \"word\"\n").key() == "data.tokenizer");
  // The enum fields: each message lists its enum's names, in order.
  CATCH_CHECK(
      std::string(error_of("[run]\nmode = \"DiLoCo\"\n").what()) ==
      "config error: run.mode = \"DiLoCo\": allowed values are diloco, single, ddp (at test.toml:2:8)");
  CATCH_CHECK_THAT(error_of("[model]\ndtype = \"fp16\"\n").what(),
                   Contains("model.dtype = \"fp16\": allowed values are fp32, bf16"));
  CATCH_CHECK_THAT(error_of("[data]\ntokenizer = \"word\"\n").what(),
                   Contains("data.tokenizer = \"word\": allowed values are byte, bpe"));
  CATCH_CHECK_THAT(error_of("[diloco]\nouter = \"eagr\"\n").what(),
                   Contains("diloco.outer = \"eagr\": allowed values are sync, delayed, eager, streaming"));
  CATCH_CHECK_THAT(error_of("[comm]\ndtype = \"FP16\"\n").what(),
                   Contains("comm.dtype = \"FP16\": allowed values are fp32, fp16, bf16, int8"));
  CATCH_CHECK_THAT(error_of("[comm]\ndtype = true\n").what(),
                   Contains("comm.dtype = true: expected a string, got a boolean"));
}

CATCH_TEST_CASE("Each config enum has one table of names, read both ways", "[config]") {
  using longwave::config::from_string;
  using longwave::config::to_string;
  CATCH_CHECK(std::string(to_string(run_mode::ddp)) == "ddp");
  CATCH_CHECK(from_string<run_mode>("single") == run_mode::single);
  CATCH_CHECK(from_string<outer_policy_kind>("streaming") == outer_policy_kind::streaming);
  CATCH_CHECK(from_string<fragment_layout>("sequential") == fragment_layout::sequential);
  CATCH_CHECK(from_string<model_dtype>("bf16") == model_dtype::bf16);
  CATCH_CHECK(from_string<tokenizer_kind>("bpe") == tokenizer_kind::bpe);
  CATCH_CHECK(from_string<wire_dtype>("int8") == wire_dtype::int8);
  for (const auto dt : {wire_dtype::fp32, wire_dtype::fp16, wire_dtype::bf16, wire_dtype::int8})
    CATCH_CHECK(from_string<wire_dtype>(to_string(dt)) == dt);
  CATCH_CHECK(!from_string<run_mode>("DDP"));
  CATCH_CHECK(!from_string<outer_policy_kind>(""));
  CATCH_CHECK(std::string(to_string(static_cast<wire_dtype>(9))) == "invalid");
  // A value set from code outside the enum is refused by validate, naming the key.
  train_config c;
  c.diloco.outer = static_cast<outer_policy_kind>(7);
  const config_error e = validate_error(c);
  CATCH_CHECK(e.key() == "diloco.outer");
  CATCH_CHECK_THAT(e.what(), Contains("diloco.outer = \"invalid\": allowed values are sync, delayed"));
}

CATCH_TEST_CASE("An enum name is checked after every line and --set, like a string's", "[config]") {
  // A later --set may correct a bad name in the file...
  CATCH_CHECK(parse_config("[run]\nmode = \"bad\"\n", {"run.mode=ddp"}, "").run.mode == run_mode::ddp);
  // ... and a later bad one is the one reported, where it was set.
  CATCH_CHECK(std::string(error_of("", {"run.mode=single", "run.mode=bad"}).what()) ==
              "config error: run.mode = \"bad\": allowed values are diloco, single, ddp (from --set)");
  // --set takes the bare text as the name, quoted or not.
  const train_config c =
      parse_config("", {"comm.dtype=\"int8\"", "model.dtype=bf16", "diloco.fragment_pattern=sequential"}, "");
  CATCH_CHECK(c.comm.dtype == wire_dtype::int8);
  CATCH_CHECK(c.model.dtype == model_dtype::bf16);
  CATCH_CHECK(c.diloco.fragment_pattern == fragment_layout::sequential);
  CATCH_CHECK(
      std::string(error_of("", {"comm.dtype=1"}).what()) ==
      "config error: comm.dtype = \"1\": allowed values are fp32, fp16, bf16, int8, sparse (from --set)");
  // Errors come in field order, as for every other field: run.mode before train.workers.
  CATCH_CHECK(error_of("[train]\nworkers = -1\n[run]\nmode = \"bad\"\n").key() == "run.mode");
}

CATCH_TEST_CASE("Out-of-range values name the key and the allowed range", "[config]") {
  struct bad_case {
    std::string text;
    std::string key;
    std::string says;
  };
  const std::vector<bad_case> cases = {
      {"[train]\nworkers = -3", "train.workers", "train.workers = -3: must be an integer in 1..256"},
      {"[train]\nworkers = 0", "train.workers", "must be an integer in 1..256"},
      {"[train]\nworkers = 257", "train.workers", "must be an integer in 1..256"},
      {"[train]\ninner_steps = 0", "train.inner_steps", "must be an integer >= 1"},
      {"[train]\nrounds = 0", "train.rounds", "must be an integer >= 1"},
      {"[train]\nbatch_size = -1", "train.batch_size", "must be an integer in 1..1048576"},
      {"[train]\nbatch_size = 1000000000", "train.batch_size", "must be an integer in 1..1048576"},
      {"[train]\nlr = 0", "train.lr", "must be a finite number > 0 and <= 10"},
      {"[train]\nlr = 10.5", "train.lr", "must be a finite number > 0 and <= 10"},
      {"[train]\nlr = nan", "train.lr", "train.lr = nan"},
      {"[train]\nwarmup_steps = -1", "train.warmup_steps", "must be an integer >= 0"},
      {"[train]\nmin_lr_ratio = 1.5", "train.min_lr_ratio", ">= 0 and <= 1"},
      {"[train]\nweight_decay = -0.1", "train.weight_decay", ">= 0 and <= 1"},
      {"[train]\nweight_decay = 1e300", "train.weight_decay", "must be a finite number >= 0 and <= 1"},
      {"[train]\nbeta1 = 1.0", "train.beta1", ">= 0 and < 1"},
      {"[train]\nbeta2 = -0.5", "train.beta2", ">= 0 and < 1"},
      {"[train]\neps = 0", "train.eps", "must be a finite number >= 1e-30 and <= 0.01"},
      {"[train]\neps = 1e-300", "train.eps", ">= 1e-30 and <= 0.01"},
      {"[train]\neps = 1e300", "train.eps", ">= 1e-30 and <= 0.01"},
      {"[train]\ngrad_clip = -1", "train.grad_clip", ">= 0"},
      {"[train]\nthreads = -1", "train.threads", "must be an integer in 0..1024"},
      {"[train]\nthreads = 1000000000", "train.threads", "must be an integer in 0..1024"},
      {"[outer]\nlr = 0", "outer.lr", "> 0"},
      {"[outer]\nlr = 1e300", "outer.lr", "outer.lr = 1e+300: must be a finite number > 0 and <= 10"},
      {"[outer]\nlr = 10.5", "outer.lr", "> 0 and <= 10"},
      {"[outer]\nlr = inf", "outer.lr", "outer.lr = inf: must be a finite number > 0"},
      {"[outer]\nmomentum = 1", "outer.momentum", "> -1 and < 1"},
      {"[outer]\nmomentum = -1", "outer.momentum", "> -1 and < 1"},
      {"[eval]\nevery_rounds = -1", "eval.every_rounds", ">= 0"},
      {"[eval]\nbatches = 0", "eval.batches", ">= 1"},
      {"[checkpoint]\nevery_rounds = -2", "checkpoint.every_rounds", ">= 0"},
      {"[checkpoint]\nkeep = 0", "checkpoint.keep", ">= 1"},
      {"[metrics]\nport = 65536", "metrics.port", "must be an integer in 0..65535"},
      {"[metrics]\nport = -1", "metrics.port", "must be an integer in 0..65535"},
      {"[runtime]\nround_timeout_s = 0", "runtime.round_timeout_s", "> 0"},
      {"[runtime]\nrequest_timeout_s = -5", "runtime.request_timeout_s", "> 0"},
      {"[runtime]\nround_timeout_s = 1e30", "runtime.round_timeout_s", "<= 1000000000"},
      {"[runtime]\nlog_every_steps = 0", "runtime.log_every_steps", ">= 1"},
      {"[model]\nseq_len = 4", "model.seq_len", "must be an integer in 8..8192"},
      {"[model]\nseq_len = 8193", "model.seq_len", "must be an integer in 8..8192"},
      {"[model]\nvocab_size = 1", "model.vocab_size", "must be 0 or an integer in 2..65536"},
      {"[model]\nvocab_size = 70000", "model.vocab_size", "must be 0 or an integer in 2..65536"},
      {"[data]\nbpe_vocab_size = 256", "data.bpe_vocab_size", "must be an integer in 257..65535"},
      {"[data]\nval_fraction = 0", "data.val_fraction", "> 0 and <= 0.5"},
      {"[data]\nval_fraction = 0.6", "data.val_fraction", "> 0 and <= 0.5"},
      {"[run]\nout_dir = \"\"", "run.out_dir", "run.out_dir = \"\": must not be empty"},
      {"[run]\nseed = -1", "run.seed", "run.seed = -1: must be an integer >= 0"},
  };
  for (const auto& c : cases) {
    CATCH_CAPTURE(c.text);
    const config_error e = error_of(c.text);
    CATCH_CHECK(e.key() == c.key);
    CATCH_CHECK_THAT(e.what(), Contains(c.key));
    CATCH_CHECK_THAT(e.what(), Contains(c.says));
  }
}

CATCH_TEST_CASE("Boundary values of the ranges are accepted", "[config]") {
  const train_config c = parse_config(
      "[model]\nseq_len = 8192\nvocab_size = 65536\n[data]\nval_fraction = 0.5\nbpe_vocab_size = 65535\n"
      "[train]\nworkers = 256\nlr = 10\nmin_lr_ratio = 1\nbeta1 = 0\ngrad_clip = 0\nwarmup_steps = 0\n"
      "batch_size = 1048576\nweight_decay = 1\neps = 1e-2\nthreads = 1024\n[outer]\nlr = 10\n"
      "[metrics]\nport = 65535\n[eval]\nevery_rounds = 0\n[checkpoint]\nevery_rounds = 0\n",
      {}, "");
  CATCH_CHECK(c.train.workers == 256);
  CATCH_CHECK(c.train.batch_size == 1048576);
  CATCH_CHECK(c.outer.lr == 10.0);
  CATCH_CHECK_NOTHROW(parse_config("[train]\neps = 1e-30\nweight_decay = 0\nthreads = 0\n", {}, ""));
  CATCH_CHECK(c.data.val_fraction == 0.5);
  CATCH_CHECK(c.metrics.port == 65535);
}

CATCH_TEST_CASE("A TOML syntax error reports line and column under the key syntax", "[config]") {
  const config_error e = error_of("[train]\nworkers = 4\nlr = = 3\n");
  CATCH_CHECK(e.key() == "syntax");
  CATCH_CHECK_THAT(e.what(), Contains("syntax error at test.toml:3:"));
  CATCH_CHECK_THAT(e.what(), Contains("lr = = 3"));
  const config_error dup = error_of("[train]\nworkers = 4\nworkers = 5\n");
  CATCH_CHECK(dup.key() == "syntax");
  const config_error bytes = error_of("[run]\nname = \"\xff\xfe\"\n");
  CATCH_CHECK(bytes.key() == "syntax");
  CATCH_CHECK_THAT(bytes.what(), Contains("test.toml:2:"));
  CATCH_CHECK_THAT(bytes.what(), !Contains("\xff"));
}

CATCH_TEST_CASE("An integer too big for int64 is an error, not a crash", "[config]") {
  const config_error in_file = error_of("[train]\nworkers = 99999999999999999999\n");
  CATCH_CHECK(in_file.key() == "syntax");
  CATCH_CHECK_THAT(in_file.what(), Contains("2:"));
  CATCH_CHECK_THAT(in_file.what(), Contains("workers = 99999999999999999999"));
  const config_error in_set = error_of("", {"train.workers=99999999999999999999"});
  CATCH_CHECK(in_set.key() == "train.workers");
  CATCH_CHECK_THAT(in_set.what(), Contains("train.workers = 99999999999999999999: not an integer"));
  CATCH_CHECK_THAT(in_set.what(), Contains("--set"));
  const config_error product = error_of("[train]\nrounds = 9223372036854775807\ninner_steps = 2\n");
  CATCH_CHECK(product.key() == "train.rounds");
  // The larger factor is named: it named train.rounds for an inner_steps set too large.
  const config_error steps = error_of("[train]\nrounds = 4\ninner_steps = 4611686018427387904\n");
  CATCH_CHECK(steps.key() == "train.inner_steps");
  CATCH_CHECK_THAT(steps.what(), Contains("train.inner_steps = 4611686018427387904: train.rounds * "
                                          "train.inner_steps (4 * 4611686018427387904) does not fit"));
}

CATCH_TEST_CASE("Values that overflow float or wreck training are refused from --set too", "[config]") {
  // Found by a sweep of --set values: each was accepted and then crashed the run or trained to NaN.
  for (const std::string ov :
       {"outer.lr=1e300", "train.weight_decay=1e300", "train.eps=1e300", "train.batch_size=1000000000"}) {
    CATCH_CAPTURE(ov);
    const config_error e = error_of("", {ov});
    CATCH_CHECK(e.key() == ov.substr(0, ov.find('=')));
    CATCH_CHECK_THAT(e.what(), Contains("must be"));
    CATCH_CHECK_THAT(e.what(), Contains("(from --set)"));
  }
}

CATCH_TEST_CASE("A bad override is named", "[config]") {
  const config_error no_eq = error_of("", {"train.workers"});
  CATCH_CHECK(no_eq.key() == "train.workers");
  CATCH_CHECK_THAT(no_eq.what(), Contains("override 'train.workers' has no '='"));
  const config_error no_dot = error_of("", {"workers=2"});
  CATCH_CHECK(no_dot.key() == "workers");
  CATCH_CHECK_THAT(no_dot.what(), Contains("section.key"));
  CATCH_CHECK_THAT(no_dot.what(), Contains("did you mean 'train.workers'?"));
  const config_error unknown = error_of("", {"train.wrkers=2"});
  CATCH_CHECK(unknown.key() == "train.wrkers");
  CATCH_CHECK_THAT(unknown.what(), Contains("unknown key 'train.wrkers' (did you mean 'train.workers'?)"));
  const config_error section = error_of("", {"trian.workers=2"});
  CATCH_CHECK(section.key() == "trian.workers");
  CATCH_CHECK_THAT(section.what(), Contains("did you mean 'train.workers'?"));
}

CATCH_TEST_CASE("A bad override value names the key and says it came from --set", "[config]") {
  const config_error word = error_of("", {"train.workers=four"});
  CATCH_CHECK(word.key() == "train.workers");
  CATCH_CHECK_THAT(word.what(),
                   Contains("train.workers = \"four\": expected an integer, got a string (from --set)"));
  const config_error flag = error_of("", {"outer.nesterov=yes"});
  CATCH_CHECK(flag.key() == "outer.nesterov");
  CATCH_CHECK_THAT(flag.what(), Contains("expected a boolean"));
  const config_error range = error_of("", {"train.lr=20"});
  CATCH_CHECK(range.key() == "train.lr");
  CATCH_CHECK_THAT(range.what(),
                   Contains("train.lr = 20: must be a finite number > 0 and <= 10 (from --set)"));
  const config_error multi = error_of("", {"train.workers=4\n[run]\nmode=\"single\""});
  CATCH_CHECK(multi.key() == "train.workers");
  // A string field would take the raw text as it is: a line break is refused there too.
  const config_error name = error_of("", {"run.name=a\nb"});
  CATCH_CHECK(name.key() == "run.name");
  CATCH_CHECK_THAT(name.what(), Contains("line break"));
}

CATCH_TEST_CASE("A path with a line break or a control character in a config file is refused", "[config]") {
  const config_error out = error_of("[run]\nout_dir = \"runs/a\\nb\"\n", {});
  CATCH_CHECK(out.key() == "run.out_dir");
  CATCH_CHECK_THAT(out.what(), Contains("run.out_dir: the path contains a line break (byte 0x0a at 6)"));
  const config_error data = error_of("[data]\npath = \"corpus\\t.txt\"\n", {});
  CATCH_CHECK(data.key() == "data.path");
  CATCH_CHECK_THAT(data.what(), Contains("a control character (byte 0x09 at 6)"));
  const config_error ckpt = error_of("[checkpoint]\ndir = \"c\\u007f\"\n", {});
  CATCH_CHECK(ckpt.key() == "checkpoint.dir");
  // A TOML escape in run.name, which labels one-line logs and records (a probe: it broke report's lines).
  const config_error name = error_of("", {"run.name=\"a\\nb\""});
  CATCH_CHECK(name.key() == "run.name");
  CATCH_CHECK_THAT(name.what(), Contains("run.name: the name contains a line break"));
  CATCH_CHECK_NOTHROW(parse_config("[run]\nout_dir = \"runs/é b\"\n", {}, "test"));
}

CATCH_TEST_CASE("A key of very many dotted parts is a syntax error, not a stack overflow", "[config]") {
  // toml++ nests a table per part and frees them recursively: some 50,000 parts overflowed the stack.
  std::string deep = "a";
  for (int i = 0; i < 100000; ++i) deep += ".a";
  for (const std::string& text : {"[" + deep + "]\n", deep + " = 1\n", "[train]\n\n" + deep + " = 1\n",
                                  "x = {" + deep + " = 1}\n", "x = [1, {y = 2, " + deep + " = 1}]\n"}) {
    const config_error e = error_of("[run]\nname = \"n\"  # a.b.c\n" + text);
    // Multi-line strings may end in up to two quotes of their own (the TOML spec's str7): not a string's
    // start, or what follows would read as string.
    const config_error q = error_of("a = \"\"\"\"quoted.\"\"\"\"\nb = '''''x.y'''''\n" + text);
    CATCH_CHECK_THAT(q.what(), Contains("a key of more than 64 dotted parts"));
    const std::string line = text[1] == 't' ? "test.toml:5:1" : "test.toml:3:1";
    CATCH_CHECK(e.key() == "syntax");
    CATCH_CHECK_THAT(e.what(), Contains(line) && Contains("a key of more than 64 dotted parts"));
  }
  // Dots elsewhere are not parts: in strings, comments, numbers, dates, 64 parts of a key.
  std::string many = "[run]\nname = \"" + std::string(500, '.') + "\"\n# " + std::string(500, '.') + "\n";
  many += "[diloco]\nxs = [";
  for (int i = 0; i < 200; ++i) many += "1.5, ";
  many += "]\nwhen = 1979-05-27T07:32:00.999999\n";
  std::string parts = "p";
  for (int i = 1; i < 64; ++i) parts += ".p";
  CATCH_CHECK_THAT(error_of(many + parts + " = 1\n").what(), !Contains("dotted parts"));
  const config_error set = error_of("", {"train.lr={" + deep + " = 1}"});
  CATCH_CHECK(set.key() == "train.lr");
}

CATCH_TEST_CASE("An override value that is not UTF-8 is refused: the run's config.toml could not hold it",
                "[config]") {
  for (const std::string bad :
       {"x\xff", "caf\xe9.txt", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    const config_error e = error_of("", {"run.name=" + bad});
    CATCH_CHECK(e.key() == "run.name");
    CATCH_CHECK_THAT(e.what(), Contains("not UTF-8 text"));
  }
  CATCH_CHECK(parse_config("", {"run.name=caf\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x98\x80"}, "").run.name ==
              "caf\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x98\x80");
}

CATCH_TEST_CASE("Single mode with 4 workers asks for train.workers = 1", "[config]") {
  const config_error e = error_of("[run]\nmode = \"single\"\n");
  CATCH_CHECK(e.key() == "train.workers");
  CATCH_CHECK_THAT(e.what(), Contains("train.workers = 4"));
  CATCH_CHECK_THAT(e.what(), Contains("run.mode = \"single\""));
  CATCH_CHECK_THAT(e.what(), Contains("--set train.workers=1"));
  CATCH_CHECK_NOTHROW(parse_config("[run]\nmode = \"single\"\n[train]\nworkers = 1\n", {}, ""));
}

CATCH_TEST_CASE("A vocabulary smaller than the tokenizer's is rejected", "[config]") {
  const config_error byte = error_of("[model]\nvocab_size = 100\n");
  CATCH_CHECK(byte.key() == "model.vocab_size");
  CATCH_CHECK_THAT(byte.what(), Contains("256"));
  const config_error bpe =
      error_of("[model]\nvocab_size = 1000\n[data]\ntokenizer = \"bpe\"\nbpe_vocab_size = 2000\n");
  CATCH_CHECK(bpe.key() == "model.vocab_size");
  CATCH_CHECK_NOTHROW(parse_config("[model]\nvocab_size = 256\n", {}, ""));
  // A run on ready shards took 200 (their ids end below it); its checkpoint's stored config is read where its
  // data.path is no folder any more (eval, export elsewhere): not checked against the byte tokenizer again.
  const std::string stored = "[model]\nvocab_size = 200\n[data]\npath = \"/nonexistent/shards\"\n";
  CATCH_CHECK_NOTHROW(parse_config(stored, {}, "", {}, /*check_paths=*/false));
}

CATCH_TEST_CASE("validate checks a struct filled in code", "[config]") {
  train_config c;
  c.run.seed = std::numeric_limits<uint64_t>::max();
  const config_error seed = validate_error(c);
  CATCH_CHECK(seed.key() == "run.seed");
  CATCH_CHECK_THAT(seed.what(), Contains("must be an integer in 0..9223372036854775807"));
  c = train_config{};
  c.train.workers = 0;
  CATCH_CHECK(validate_error(c).key() == "train.workers");
  c = train_config{};
  c.train.beta2 = std::numeric_limits<double>::infinity();
  CATCH_CHECK(validate_error(c).key() == "train.beta2");
}

CATCH_TEST_CASE("Errors carry the message without the prefix and stay on one line", "[config]") {
  const config_error e("train.workers", "line one\nline two");
  CATCH_CHECK(e.key() == "train.workers");
  CATCH_CHECK(e.message() == "line one line two");
  CATCH_CHECK(std::string(e.what()) == "config error: line one line two");
}

CATCH_TEST_CASE("load_config_file reads a file and names its stem as the run", "[config]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lw_config_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "my_run.toml";
  {
    std::ofstream out(file);
    out << "[train]\nworkers = 2\n";
  }
  const train_config c = load_config_file(file.string(), {"train.rounds=3"});
  CATCH_CHECK(c.train.workers == 2);
  CATCH_CHECK(c.train.rounds == 3);
  CATCH_CHECK(c.run.name == "my_run");

  {
    std::ofstream out(file);
    out << "[train]\nworkers = 0\n";
  }
  try {
    load_config_file(file.string(), {});
    CATCH_FAIL("workers = 0 was accepted");
  } catch (const config_error& e) {
    CATCH_CHECK(e.key() == "train.workers");
    CATCH_CHECK_THAT(e.what(), Contains(file.string() + ":2:11"));
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("load_config_file reports a missing file or a directory under the key file", "[config]") {
  try {
    load_config_file("/nonexistent/longwave/none.toml", {});
    CATCH_FAIL("a missing file was accepted");
  } catch (const config_error& e) {
    CATCH_CHECK(e.key() == "file");
    CATCH_CHECK_THAT(e.what(), Contains("/nonexistent/longwave/none.toml"));
  }
  CATCH_REQUIRE_THROWS_WITH(load_config_file(std::filesystem::temp_directory_path().string(), {}),
                            Contains("is a directory"));
  // A device would be read forever (/dev/zero); /dev/null is one too. A pipe (`longwave run <(…)`) would be
  // read by the front binary and found empty by longwave-torch: a default config, silently.
  CATCH_REQUIRE_THROWS_WITH(load_config_file("/dev/null", {}), Contains("/dev/null': not a regular file"));
  const auto fifo = std::filesystem::temp_directory_path() / ("lw_config_fifo_" + std::to_string(::getpid()));
  CATCH_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CATCH_REQUIRE_THROWS_WITH(load_config_file(fifo.string(), {}), Contains("write the config to a file"));
  std::filesystem::remove(fifo);
}

CATCH_TEST_CASE(
    "A run in one process draws its federated clients from its own workers, and --dry-run says so",
    "[config]") {
  namespace fs = std::filesystem;
  const auto file = fs::temp_directory_path() / ("lw_config_fed_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(file) << "[train]\nworkers = 2\n[federated]\nclients_per_round = 2\n";
  CATCH_CHECK_NOTHROW(load_config_file(file.string(), {}));
  try {
    load_config_file(file.string(), {"federated.clients_per_round=3"});
    CATCH_FAIL("3 clients of 2 workers were accepted");
  } catch (const config_error& e) {
    CATCH_CHECK(e.key() == "federated.clients_per_round");
    CATCH_CHECK_THAT(e.what(), Contains("the run has 2 clients (workers) to draw from"));
  }
  // A cluster's train section (parse_config) counts the nodes' workers: not checked there.
  CATCH_CHECK_NOTHROW(parse_config("[train]\nworkers = 2\n[federated]\nclients_per_round = 3\n", {}, ""));
  fs::remove(file);
}

CATCH_TEST_CASE("Streaming needs inner_steps divisible by the fragments and tau below H / P", "[config]") {
  const std::string base = "[train]\ninner_steps = 12\n[diloco]\nouter = \"streaming\"\n";
  CATCH_CHECK_NOTHROW(parse_config(base + "fragments = 3\ntau = 3\n", {}, ""));
  const config_error a = error_of(base + "fragments = 5\n");
  CATCH_CHECK(a.key() == "diloco.fragments");
  CATCH_CHECK_THAT(a.what(), Contains("train.inner_steps (12) must be a multiple"));
  const config_error b = error_of(base + "fragments = 3\ntau = 4\n");
  CATCH_CHECK(b.key() == "diloco.tau");
  CATCH_CHECK_THAT(b.what(), Contains("below train.inner_steps / diloco.fragments = 4"));
  const config_error c = error_of(base + "fragment_pattern = \"random\"\n");
  CATCH_CHECK(c.key() == "diloco.fragment_pattern");
  const config_error d = error_of(base + "alpha = 1.5\n");
  CATCH_CHECK(d.key() == "diloco.alpha");
  // More fragments than layers: refused by the config (a coordinator started with it; its nodes failed).
  const config_error e = error_of(base + "fragments = 6\n[model]\npreset = \"tiny\"\nlayers = 4\n");
  CATCH_CHECK(e.key() == "diloco.fragments");
  CATCH_CHECK_THAT(
      e.what(),
      Contains(
          "diloco.fragments = 6: the model has only 4 layers to split into fragments (model.layers = 4)"));
  // The streaming rules apply only to streaming.
  CATCH_CHECK_NOTHROW(parse_config("[train]\ninner_steps = 7\n[diloco]\nouter = \"eager\"\n", {}, ""));
}

CATCH_TEST_CASE(
    "diloco.adaptive_steps runs with sync, delayed or eager on either backend, its floor within H",
    "[config]") {
  const std::string base = "[train]\ninner_steps = 16\n[diloco]\nadaptive_steps = true\n";
  for (const char* outer : {"sync", "delayed", "eager"}) {
    const auto cfg = parse_config(base + "outer = \"" + outer + "\"\n", {}, "");
    CATCH_CHECK(cfg.diloco.adaptive_steps);
    CATCH_CHECK(cfg.diloco.step_floor(16) == 2);  // H / 8
  }
  CATCH_CHECK(parse_config(base + "min_steps = 16\n", {}, "").diloco.step_floor(16) == 16);
  const config_error floor = error_of(base + "min_steps = 17\n");
  CATCH_CHECK(floor.key() == "diloco.min_steps");
  CATCH_CHECK_THAT(floor.what(), Contains("above train.inner_steps = 16"));
  const config_error streaming = error_of(base + "outer = \"streaming\"\nfragments = 2\n");
  CATCH_CHECK(streaming.key() == "diloco.adaptive_steps");
  CATCH_CHECK_THAT(streaming.what(), Contains("\"streaming\" syncs its fragments at fixed inner steps"));
  const config_error ddp = error_of(base + "[run]\nmode = \"ddp\"\n");
  CATCH_CHECK(ddp.key() == "diloco.adaptive_steps");
  CATCH_CHECK_THAT(ddp.what(), Contains("this run: \"ddp\""));
  const config_error sampled = error_of(base + "[federated]\nclients_per_round = 1\n");
  CATCH_CHECK(sampled.key() == "diloco.adaptive_steps");
  // NCCL carries the notes in its epochs' confirmations as the ring does.
  CATCH_CHECK(parse_config(base + "[comm]\nbackend = \"nccl\"\n", {}, "").diloco.adaptive_steps);
  // min_steps alone, without adaptive steps, is only checked against H.
  CATCH_CHECK_NOTHROW(parse_config("[diloco]\nmin_steps = 3\n", {}, ""));
}

CATCH_TEST_CASE("diloco.outer = async reads [async] and refuses what it cannot run, naming the key",
                "[config][async]") {
  const auto cfg = parse_config(
      "[diloco]\nouter = \"async\"\n[async]\nquorum = 2\ngrace_min_s = 0.5\ngrace_max_s = 3\nmax_staleness = "
      "2\n"
      "dn_period = 4\nage_scaling = \"cgad\"\ncgad_alpha = 0.2\ncgad_cutoff = 5\ntokens = 100000\n",
      {}, "");
  CATCH_CHECK(cfg.diloco.outer == outer_policy_kind::async);
  CATCH_CHECK(cfg.async.quorum == 2);
  CATCH_CHECK(cfg.async.grace_min_s == 0.5);
  CATCH_CHECK(cfg.async.grace_max_s == 3);
  CATCH_CHECK(cfg.async.max_staleness == 2);
  CATCH_CHECK(cfg.async.dn_period == 4);
  CATCH_CHECK(cfg.async.age_scaling == age_scaling_kind::cgad);
  CATCH_CHECK(cfg.async.cgad_alpha == 0.2);
  CATCH_CHECK(cfg.async.cgad_cutoff == 5);
  CATCH_CHECK(cfg.async.tokens == 100000);
  const std::string base = "[diloco]\nouter = \"async\"\n";
  const config_error grace = error_of(base + "[async]\ngrace_min_s = 6\ngrace_max_s = 5\n");
  CATCH_CHECK(grace.key() == "async.grace_min_s");
  CATCH_CHECK_THAT(grace.what(), Contains("above async.grace_max_s = 5"));
  const config_error dylu = error_of(base + "adaptive_steps = true\n");
  CATCH_CHECK(dylu.key() == "diloco.adaptive_steps");
  const config_error nccl = error_of(base + "[comm]\nbackend = \"nccl\"\n");
  CATCH_CHECK(nccl.key() == "comm.backend");
  const config_error classic = error_of(base + "[outer]\nnesterov = false\n");
  CATCH_CHECK(classic.key() == "outer.nesterov");
  CATCH_CHECK_THAT(classic.what(), Contains("Delayed Nesterov"));
  const config_error ddp = error_of(base + "[run]\nmode = \"ddp\"\n");
  CATCH_CHECK(ddp.key() == "diloco.outer");
  CATCH_CHECK_THAT(error_of(base + "[async]\nage_scaling = \"heloco\"\n").what(),
                   Contains("allowed values are none, cgad"));
  CATCH_CHECK(error_of(base + "[async]\nquorum = 0\n").key() == "async.quorum");
  // [async] is read, and left alone, under the other policies.
  CATCH_CHECK_NOTHROW(parse_config("[async]\nquorum = 3\n[outer]\nnesterov = false\n", {}, ""));
}

CATCH_TEST_CASE("comm.backend picks ring or nccl, and nccl refuses int8 naming both keys", "[config]") {
  CATCH_CHECK(parse_config("", {}, "").comm.backend == comm_backend::ring);
  CATCH_CHECK(parse_config("[comm]\nbackend = \"nccl\"\ndtype = \"bf16\"\n", {}, "").comm.backend ==
              comm_backend::nccl);
  CATCH_CHECK(parse_config("", {"comm.backend=nccl"}, "").comm.backend == comm_backend::nccl);
  CATCH_CHECK_THAT(error_of("[comm]\nbackend = \"gloo\"\n").what(),
                   Contains("comm.backend = \"gloo\": allowed values are ring, nccl"));
  const config_error e = error_of("[comm]\nbackend = \"nccl\"\ndtype = \"int8\"\n");
  CATCH_CHECK(e.key() == "comm.dtype");
  CATCH_CHECK_THAT(e.what(),
                   Contains("comm.dtype = \"int8\": comm.backend = \"nccl\" reduces fp32, fp16 and bf16"));
  CATCH_CHECK_NOTHROW(parse_config("[comm]\nbackend = \"ring\"\ndtype = \"int8\"\n", {}, ""));
}

CATCH_TEST_CASE("train.device takes cpu, cuda, cuda:N and auto, and train.autocast off, bf16 and auto",
                "[config]") {
  CATCH_CHECK(parse_config("", {}, "").train.device == "cpu");
  CATCH_CHECK(parse_config("", {}, "").train.autocast == autocast_mode::automatic);
  for (const std::string d : {"cpu", "cuda", "cuda:0", "cuda:7", "cuda:123", "auto"})
    CATCH_CHECK(parse_config("[train]\ndevice = \"" + d + "\"\n", {}, "").train.device == d);
  CATCH_CHECK(parse_config("", {"train.device=cuda:1"}, "").train.device == "cuda:1");
  for (const std::string d : {"gpu", "cuda:", "cuda:x", "cuda:1234", "CUDA", "cuda0", "cpu:0", ""}) {
    CATCH_INFO(d);
    const config_error e = error_of("[train]\ndevice = \"" + d + "\"\n");
    CATCH_CHECK(e.key() == "train.device");
    if (!d.empty())
      CATCH_CHECK_THAT(e.what(), Contains("train.device = \"" + d +
                                          "\": allowed values are cpu, cuda, cuda:N (a GPU index) and auto"));
  }
  CATCH_CHECK(parse_config("[train]\nautocast = \"bf16\"\n", {}, "").train.autocast == autocast_mode::bf16);
  CATCH_CHECK(parse_config("", {"train.autocast=off"}, "").train.autocast == autocast_mode::off);
  CATCH_CHECK_THAT(error_of("[train]\nautocast = \"fp16\"\n").what(),
                   Contains("train.autocast = \"fp16\": allowed values are off, bf16, auto"));
  // The device is per node: it is not part of the training fingerprint (a cluster may mix CPUs and GPUs).
  const auto cpu = parse_config("", {}, ""), gpu = parse_config("", {"train.device=cuda"}, "");
  CATCH_CHECK(longwave::config::training_fingerprint(cpu) == longwave::config::training_fingerprint(gpu));
  CATCH_CHECK(longwave::config::training_fingerprint(cpu) !=
              longwave::config::training_fingerprint(parse_config("", {"train.autocast=off"}, "")));
}

CATCH_TEST_CASE("train.micro_batches divides the batch, and it and train.deterministic are per node",
                "[config]") {
  CATCH_CHECK(parse_config("", {}, "").train.micro_batches == 1);
  CATCH_CHECK_FALSE(parse_config("", {}, "").train.deterministic);
  const auto c = parse_config("[train]\nbatch_size = 32\nmicro_batches = 4\ndeterministic = true\n", {}, "");
  CATCH_CHECK(c.train.micro_batches == 4);
  CATCH_CHECK(c.train.deterministic);
  const config_error e = error_of("[train]\nbatch_size = 8\nmicro_batches = 3\n");
  CATCH_CHECK(e.key() == "train.micro_batches");
  CATCH_CHECK_THAT(e.what(), Contains("train.micro_batches = 3: must divide train.batch_size = 8"));
  CATCH_CHECK(error_of("[train]\nmicro_batches = 0\n").key() == "train.micro_batches");
  CATCH_CHECK(error_of("[train]\ndeterministic = \"yes\"\n").key() == "train.deterministic");
  // A node's memory and its kernels' settings are its own: neither is part of the training fingerprint.
  const auto base = parse_config("[train]\nbatch_size = 8\n", {}, "");
  CATCH_CHECK(longwave::config::training_fingerprint(base) ==
              longwave::config::training_fingerprint(parse_config(
                  "[train]\nbatch_size = 8\nmicro_batches = 2\ndeterministic = true\n", {}, "")));
}

CATCH_TEST_CASE("comm.dtype = sparse takes its codec keys, checked, and refuses nccl and 3 bits",
                "[config]") {
  const train_config c = parse_config(
      "[comm]\ndtype = \"sparse\"\ndensity = 0.03\nvalue_bits = 4\nsparse_chunk = 1024\nef_decay = 0.9\n"
      "robust_clip = true\n",
      {}, "");
  CATCH_CHECK(c.comm.dtype == wire_dtype::sparse);
  CATCH_CHECK(c.comm.density == 0.03);
  CATCH_CHECK(c.comm.value_bits == 4);
  CATCH_CHECK(c.comm.sparse_chunk == 1024);
  CATCH_CHECK(c.comm.ef_decay == Approx(0.9));
  CATCH_CHECK(c.comm.robust_clip);
  CATCH_CHECK(error_of("[comm]\ndensity = 0\n").key() == "comm.density");
  CATCH_CHECK(error_of("[comm]\ndensity = 1.5\n").key() == "comm.density");
  CATCH_CHECK(error_of("[comm]\nef_decay = -0.1\n").key() == "comm.ef_decay");
  // Shared indices diverge with a slowly decaying residual (measured): above 0.5 is refused.
  CATCH_CHECK_THAT(error_of("[comm]\ndtype = \"sparse\"\nsparse_indices = \"shared\"\n").what(),
                   Contains("comm.ef_decay = 0.95: with comm.sparse_indices = \"shared\""));
  CATCH_CHECK_NOTHROW(
      parse_config("[comm]\ndtype = \"sparse\"\nsparse_indices = \"shared\"\nef_decay = 0.5\n", {}, ""));
  CATCH_CHECK(error_of("[comm]\nsparse_chunk = 0\n").key() == "comm.sparse_chunk");
  CATCH_CHECK_THAT(error_of("[comm]\nvalue_bits = 3\n").what(), Contains("2 or 4 bits"));
  CATCH_CHECK_THAT(error_of("[comm]\nvalue_bits = 8\n").what(), Contains("comm.value_bits"));
  CATCH_CHECK_THAT(error_of("[run]\nmode = \"ddp\"\n[comm]\ndtype = \"sparse\"\n").what(),
                   Contains("run.mode = \"ddp\" averages gradients every step"));
  const config_error e = error_of("[comm]\nbackend = \"nccl\"\ndtype = \"sparse\"\n");
  CATCH_CHECK(e.key() == "comm.dtype");
  CATCH_CHECK_THAT(e.what(), Contains("use comm.backend = \"ring\""));
}

CATCH_TEST_CASE(
    "comm.sparse_indices is topk by default, takes shared, and refuses other names and robust_clip",
    "[config]") {
  CATCH_CHECK(parse_config("", {}, "").comm.sparse_indices == sparse_index_mode::topk);
  const train_config c =
      parse_config("[comm]\ndtype = \"sparse\"\nsparse_indices = \"shared\"\nef_decay = 0\n", {}, "");
  CATCH_CHECK(c.comm.sparse_indices == sparse_index_mode::shared);
  CATCH_CHECK(parse_config("", {"comm.sparse_indices=shared"}, "").comm.sparse_indices ==
              sparse_index_mode::shared);
  CATCH_CHECK_THAT(error_of("[comm]\nsparse_indices = \"random\"\n").what(),
                   Contains("comm.sparse_indices = \"random\": allowed values are topk, shared"));
  // Shared indices are summed on the ring: there is no per-node message to clip.
  const config_error e =
      error_of("[comm]\ndtype = \"sparse\"\nsparse_indices = \"shared\"\nrobust_clip = true\n");
  CATCH_CHECK(e.key() == "comm.robust_clip");
  CATCH_CHECK_THAT(e.what(), Contains("sparse_indices = \"topk\""));
}

CATCH_TEST_CASE("A directory setting that names an existing file is refused at load time", "[config]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lw_config_dirs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "a_file").string();
  std::ofstream(file) << "not a directory\n";
  for (const std::string key : {"run.out_dir", "checkpoint.dir", "data.cache_dir"}) {
    CATCH_CAPTURE(key);
    const config_error e = error_of("", {key + "=" + file});
    CATCH_CHECK(e.key() == key);
    CATCH_CHECK_THAT(e.what(), Contains(file) && Contains("is a file, not a directory"));
    CATCH_CHECK_THAT(e.what(), Contains("(from --set)"));
    // A path below a file cannot be created either.
    const config_error below = error_of("", {key + "=" + file + "/sub"});
    CATCH_CHECK(below.key() == key);
    CATCH_CHECK_THAT(below.what(), Contains("\"" + file + "\" is a file"));
  }
  // Unset, checkpoint.dir and data.cache_dir are out_dir's checkpoints/ and data/: a file there is named too.
  for (const auto& [key, sub] : {std::pair<std::string, std::string>{"checkpoint.dir", "checkpoints"},
                                 std::pair<std::string, std::string>{"data.cache_dir", "data"}}) {
    const fs::path out = dir / ("out_" + sub);
    fs::create_directories(out);
    std::ofstream((out / sub).string()) << "in the way\n";
    const config_error e = error_of("", {"run.out_dir=" + out.string()});
    CATCH_CHECK(e.key() == key);
    CATCH_CHECK_THAT(e.what(), Contains((out / sub).string()) && Contains("is a file, not a directory"));
  }
  // A dangling symbolic link, itself or on the way, is named with its target (--dry-run accepted it; the run
  // then failed making the directory).
  const fs::path dangling = dir / "dangling";
  fs::create_symlink(dir / "gone", dangling);
  for (const auto& at : {dangling, dangling / "sub"}) {
    const config_error e = error_of("", {"run.out_dir=" + at.string()});
    CATCH_CHECK(e.key() == "run.out_dir");
    CATCH_CHECK_THAT(e.what(),
                     Contains("a symbolic link to " + (dir / "gone").string() + ", which does not exist"));
    if (at != dangling) CATCH_CHECK_THAT(e.what(), Contains(dangling.string() + " is a symbolic link"));
  }
  // A name longer than the filesystem takes (--dry-run passed it; the run failed making the directory).
  const std::string long_name(256, 'x');
  const config_error too_long = error_of("", {"run.out_dir=" + (dir / long_name / "out").string()});
  CATCH_CHECK(too_long.key() == "run.out_dir");
  CATCH_CHECK_THAT(too_long.what(), Contains("a name in it is 256 bytes long"));
  CATCH_CHECK_NOTHROW(parse_config("", {"run.out_dir=" + (dir / std::string(255, 'x')).string()}, ""));
  fs::create_symlink(dir, dir / "good_link");  // a link to a directory is fine
  CATCH_CHECK_NOTHROW(parse_config("", {"run.out_dir=" + (dir / "good_link" / "x").string()}, ""));
  // A directory that exists, or that does not exist yet, is fine.
  CATCH_CHECK_NOTHROW(parse_config("", {"run.out_dir=" + dir.string()}, ""));
  CATCH_CHECK_NOTHROW(parse_config("", {"run.out_dir=" + (dir / "new" / "deeper").string()}, ""));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("load_config_file warns about a config file that sets nothing", "[config]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lw_config_empty_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "empty.toml").string();
  for (const std::string text : {"", "\n  \n# only a comment\n"}) {
    std::ofstream(file) << text;
    std::vector<std::string> warnings;
    const train_config c = load_config_file(file, {}, &warnings);
    CATCH_CHECK(c.train.workers == train_config{}.train.workers);
    CATCH_REQUIRE(warnings.size() == 1);
    CATCH_CHECK(warnings[0] == "config " + file + " is empty: every setting is its default");
    warnings.clear();
    load_config_file(file, {"train.workers=2"}, &warnings);
    CATCH_REQUIRE(warnings.size() == 1);
    CATCH_CHECK_THAT(warnings[0], Contains("every setting but the --set overrides is its default"));
  }
  std::ofstream(file) << "[train]\nworkers = 2\n";
  std::vector<std::string> warnings;
  load_config_file(file, {}, &warnings);
  CATCH_CHECK(warnings.empty());
  fs::remove_all(dir);
}

CATCH_TEST_CASE("Shape overrides replace the preset's values and 0 keeps them", "[config]") {
  using longwave::config::model_shape;
  using longwave::config::resolved_shape;
  const train_config c = parse_config("[model]\npreset = \"tiny\"\ndim = 384\n", {}, "");
  CATCH_CHECK(c.model.dim == 384);
  CATCH_CHECK(c.model.layers == 0);
  CATCH_CHECK(resolved_shape(c.model) == model_shape{384, 4, 6, 6, 512});
  const train_config o = parse_config(
      "", {"model.dim=256", "model.heads=4", "model.kv_heads=2", "model.layers=3", "model.ffn_hidden=640"},
      "");
  CATCH_CHECK(resolved_shape(o.model) == model_shape{256, 3, 4, 2, 640});
  CATCH_CHECK(resolved_shape(train_config{}.model) == longwave::config::preset_shape("tiny"));
  CATCH_CHECK(resolved_shape(parse_config("", {"model.preset=1b", "model.layers=2"}, "").model) ==
              model_shape{2048, 2, 32, 4, 5632});
}

CATCH_TEST_CASE("Each shape rule names the key that broke it", "[config]") {
  // heads must divide dim: blame heads when it was set, dim when only dim was.
  const config_error h = error_of("[model]\nheads = 5\n");
  CATCH_CHECK(h.key() == "model.heads");
  CATCH_CHECK_THAT(h.what(), Contains("must divide model.dim (192)"));
  CATCH_CHECK(error_of("[model]\ndim = 200\n").key() == "model.dim");
  // kv_heads must divide heads.
  const config_error kv = error_of("[model]\nkv_heads = 4\n");
  CATCH_CHECK(kv.key() == "model.kv_heads");
  CATCH_CHECK_THAT(kv.what(), Contains("must divide model.heads (6)"));
  CATCH_CHECK(error_of("[model]\ndim = 256\nheads = 8\nkv_heads = 16\n").key() == "model.kv_heads");
  // The preset's kv_heads no longer divides an overridden heads: heads is what changed. (A preset with a KV
  // head per head keeps one per head: tiny with heads = 4 has 4, as the docs' example wants.)
  CATCH_CHECK(error_of("", {"model.preset=1b", "model.heads=6", "model.dim=384"}).key() == "model.heads");
  CATCH_CHECK(resolved_shape(parse_config("[model]\ndim = 256\nheads = 4\n", {}, "").model) ==
              longwave::config::model_shape{256, 4, 4, 4, 512});
  CATCH_CHECK(resolved_shape(parse_config("", {"model.preset=1b", "model.heads=16"}, "").model).kv_heads ==
              4);
  // RoPE needs an even head dim: 192 / 64 = 3.
  const config_error rope = error_of("[model]\nheads = 64\nkv_heads = 64\n");
  CATCH_CHECK(rope.key() == "model.heads");
  CATCH_CHECK_THAT(rope.what(), Contains("even"));
  // Ranges: positive and bounded.
  for (const char* key : {"dim", "layers", "heads", "kv_heads", "ffn_hidden"}) {
    CATCH_CHECK(error_of("", {std::string("model.") + key + "=-1"}).key() == std::string("model.") + key);
    CATCH_CHECK(error_of("", {std::string("model.") + key + "=1000000"}).key() ==
                std::string("model.") + key);
  }
}

CATCH_TEST_CASE("A node's training settings are the fingerprinted keys, and their differences are named",
                "[config][cluster]") {
  const auto a = parse_config("", {}, ""), b = parse_config("", {"train.lr=0.002", "run.name=other"}, "");
  const auto text = training_settings(a);
  CATCH_CHECK_THAT(text, Contains("\ntrain.lr = "));
  CATCH_CHECK_THAT(text, !Contains("run.name") && !Contains("run.out_dir") && !Contains("eval."));
  // The keys the fingerprint leaves out (run.name) do not count; train.lr does, each side's value shown.
  CATCH_CHECK(training_fingerprint(a) != training_fingerprint(b));
  const auto d = settings_differences(training_settings(b), text);
  CATCH_REQUIRE(d.size() == 1);
  CATCH_CHECK_THAT(d[0], Contains("train.lr = 0.002 (0.0") && Contains(")"));
  CATCH_CHECK(settings_differences(text, text).empty());
  CATCH_CHECK(settings_differences("a.x = 1\n", "b.y = 2\n") ==
              std::vector<std::string>{"a.x = 1 ((unset))", "b.y = (unset) (2)"});
}

CATCH_TEST_CASE(
    "a setting the others leave without effect is named, once, with the setting that would use it",
    "[unit][config]") {
  using longwave::config::inert_settings;
  using longwave::config::keys_set;
  const std::string text =
      "[diloco]\ntau = 3\nfragments = 4\n[async]\nquorum = 2\ncgad_alpha = 0.5\n[train]\nrounds = 2\n";
  const auto keys = keys_set(text, {"diloco.min_steps=2", " train.workers = 2"});
  CATCH_CHECK(keys == std::set<std::string>{"async.cgad_alpha", "async.quorum", "diloco.fragments",
                                            "diloco.min_steps", "diloco.tau", "train.rounds",
                                            "train.workers"});
  auto cfg = longwave::config::parse_config(text, {"diloco.min_steps=2"}, "t");
  const auto sync = inert_settings(cfg, keys);
  CATCH_INFO(sync.size());
  CATCH_REQUIRE(sync.size() == 5);  // every one but [train]'s, each once
  CATCH_CHECK(
      sync[0] ==
      "async.cgad_alpha is set, but it applies only with diloco.outer = \"async\" (this run's is \"sync\") "
      "with async.age_scaling = \"cgad\": it has no effect");
  CATCH_CHECK(sync[3] ==
              "diloco.min_steps is set, but it applies only with diloco.adaptive_steps = true: it has no "
              "effect");
  // Under streaming its knobs apply; under async [async] does, cgad's only with age_scaling = "cgad".
  cfg.diloco.outer = longwave::config::outer_policy_kind::streaming;
  CATCH_CHECK(inert_settings(cfg, {"diloco.tau", "diloco.fragments"}).empty());
  cfg.diloco.outer = longwave::config::outer_policy_kind::async;
  const auto async = inert_settings(cfg, keys);
  CATCH_REQUIRE(async.size() == 4);
  CATCH_CHECK(async[0] ==
              "async.cgad_alpha is set, but it applies only with async.age_scaling = \"cgad\" (this "
              "run's is \"none\"): it has no effect");
  cfg.async.age_scaling = longwave::config::age_scaling_kind::cgad;
  cfg.diloco.adaptive_steps = true;
  CATCH_CHECK(inert_settings(cfg, keys).size() == 2);  // the streaming knobs
  // single and ddp have no outer step: [outer], [diloco], [async] and [federated] are all inert, named by
  // the mode (the broader rule) rather than by the policy.
  cfg.run.mode = longwave::config::run_mode::ddp;
  const auto ddp = longwave::config::inert_keys(cfg, {"outer.lr", "diloco.fragments", "train.lr"});
  CATCH_REQUIRE(ddp.size() == 2);
  CATCH_CHECK(ddp[0].key == "diloco.fragments");
  CATCH_CHECK(
      ddp[1].line ==
      "outer.lr is set, but it applies only with run.mode = \"diloco\" (this run's is \"ddp\"): it has "
      "no effect");
  // What the loader makes a ddp config set when its base turns it on is never named.
  CATCH_CHECK(
      inert_settings(cfg, {"diloco.outer", "diloco.adaptive_steps", "federated.clients_per_round"}).empty());
  cfg.run.mode = longwave::config::run_mode::diloco;
  CATCH_CHECK(inert_settings(cfg, {"outer.lr"}).empty());
  // The BPE vocabulary applies to a BPE tokenizer, and it and the split to a corpus, not to ready shards
  // (a probe: ignored without a word).
  CATCH_CHECK(
      inert_settings(cfg, {"data.bpe_vocab_size"}) ==
      std::vector<std::string>{"data.bpe_vocab_size is set, but it applies only with data.tokenizer = "
                               "\"bpe\" (this run's is \"byte\"): it has no effect"});
  cfg.data.tokenizer = longwave::config::tokenizer_kind::bpe;
  CATCH_CHECK(inert_settings(cfg, {"data.bpe_vocab_size", "data.val_fraction"}).empty());
  const auto shards =
      std::filesystem::temp_directory_path() / ("lw_inert_shards_" + std::to_string(getpid()));
  std::filesystem::create_directories(shards);
  cfg.data.path = shards.string();
  const auto on_shards = inert_settings(cfg, {"data.bpe_vocab_size", "data.val_fraction", "data.tokenizer"});
  CATCH_REQUIRE(on_shards.size() == 2);
  CATCH_CHECK(on_shards[1] ==
              "data.val_fraction is set, but it applies only with a corpus file as data.path "
              "(this run's \"" +
                  shards.string() +
                  "\" is a directory of ready shards, which keep their own vocabulary and "
                  "split): it has no effect");
  std::filesystem::remove_all(shards);
}
