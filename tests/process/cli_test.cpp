// The real longwave binary: bad configs and bad data, --dry-run, --help, a /metrics scrape during a run, and
// Ctrl-C.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <new>
#include <random>
#include <regex>
#include <stdexcept>

#include "runtime/errors/errors.hpp"
#include "tests/support/process.hpp"
#include "tests/support/prom_text.hpp"

using namespace longwave::test;

namespace {

// A small, quick run: tiny model, short context, 2 workers.
const char* quick_config = R"(
[model]
seq_len = 64
[train]
workers = 2
inner_steps = 5
rounds = 8
batch_size = 8
warmup_steps = 5
[eval]
every_rounds = 4
batches = 2
[checkpoint]
every_rounds = 1
keep = 3
[metrics]
enabled = false
)";

std::string quick_config_file(const std::string& dir, const std::string& extra = "") {
  const auto path = dir + "/quick.toml";
  write_text(path, std::string("[run]\nout_dir = \"") + dir + "/run\"\n" + quick_config + extra);
  return path;
}

int count_lines_containing(const std::string& text, const std::string& needle) {
  int n = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.find(needle) != std::string::npos) ++n;
  return n;
}

}  // namespace

CATCH_TEST_CASE("bad configs exit with code 2 and one line naming the key", "[process][config]") {
  const auto dir = scratch_dir("badcfg");
  write_text(dir + "/a_file", "not a directory\n");
  struct bad_case {
    std::string toml, key;
    std::vector<std::string> extra_args;
  };
  std::vector<bad_case> cases = {
      {"[train]\nwrkers = 4\n", "train.wrkers", {}},
      {"[train]\nworkers = \"four\"\n", "train.workers", {}},
      {"[run]\nmode = \"async\"\n", "run.mode", {}},
      {"[metrics]\naddress = \"localhost:99\"\n", "metrics.address", {}},
      {"[train]\ninner_steps = 0\n", "train.inner_steps", {}},
      {"[train]\nlr = -1.0\n", "train.lr", {}},
      {"[trainer]\nworkers = 2\n", "trainer", {}},
      {"[model]\npreset = \"huge\"\n", "model.preset", {}},
      {"[model]\nseq_len = 12.5\n", "model.seq_len", {}},
      {"[model]\nheads = 5\n", "model.heads = 5: model.heads (5) must divide model.dim (192)", {}},
      {"", "model.kv_heads", {"--set", "model.kv_heads=4"}},
      {"[outer]\nmomentum = 1.0\n", "outer.momentum", {}},
      {"[metrics]\nport = 70000\n", "metrics.port", {}},
      {"[run]\nmode = \"single\"\n", "train.workers", {}},
      {"", "train.workers", {"--set", "train.workers=abc"}},
      {"", "train.nope", {"--set", "train.nope=1"}},
      {"[data]\npath = \"/nonexistent/corpus.txt\"\n", "data.path", {}},
      // Accepted until a sweep of --set values found them: a crash, NaN, a bare bad_alloc.
      {"", "outer.lr", {"--set", "outer.lr=1e300"}},
      {"", "train.weight_decay", {"--set", "train.weight_decay=1e300"}},
      {"", "train.eps", {"--set", "train.eps=1e300"}},
      {"", "train.batch_size", {"--set", "train.batch_size=1000000000"}},
      // Within range, but the memory estimate is far beyond any machine: refused, by --dry-run too.
      {"[model]\npreset = \"1b\"\nseq_len = 8192\n[train]\nbatch_size = 1048576\n",
       "train.batch_size = 1048576: the memory estimate is",
       {"--dry-run"}},
      // NCCL reduces no int8, in any build.
      {"[comm]\nbackend = \"nccl\"\ndtype = \"int8\"\n",
       "comm.backend = \"nccl\" reduces fp32",
       {"--dry-run"}},
      {"", "run.out_dir", {"--set", "run.out_dir=" + dir + "/a_file"}},
      {"", "checkpoint.dir", {"--set", "checkpoint.dir=" + dir + "/a_file/checkpoints"}},
      // Not a file in the way, but a name the file system refuses: named by its key, not a bare
      // filesystem_error (and at parse, so --dry-run finds it).
      {"",
       "run.out_dir = \"" + dir + "/" + std::string(300, 'x') + "\": a name in it is 300 bytes long",
       {"--set", "run.out_dir=" + dir + "/" + std::string(300, 'x')}},
      // A link whose target is gone: named as such (it said "cannot be created: File exists").
      {"",
       "run.out_dir = \"" + dir + "/dangling\": a symbolic link to " + dir + "/gone, which does not exist",
       {"--set", "run.out_dir=" + dir + "/dangling"}},
      {"",
       "data.cache_dir = \"" + dir + "/dangling\": a symbolic link to " + dir + "/gone, which does not exist",
       {"--set", "data.cache_dir=" + dir + "/dangling"}},
      // A device is no corpus (it was an io_error, exit 1, and --dry-run passed it).
      {"", "data.path = \"/dev/null\": a device, a pipe or a socket", {"--set", "data.path=/dev/null"}},
      {"",
       "data.path = \"/dev/null\": a device, a pipe or a socket",
       {"--set", "data.path=/dev/null", "--dry-run"}},
  };
  // A directory that exists but takes no file, even root's (sysfs): named by its key, exit 2 (it was an
  // io_error about the lock file, exit 1).
  if (std::filesystem::is_directory("/sys/kernel"))
    for (const std::string key : {"run.out_dir", "checkpoint.dir"})
      cases.push_back({"",
                       key + " = \"/sys/kernel\": no file can be made there (cannot open the lock file "
                             "/sys/kernel/.longwave.lock",
                       {"--set", key + "=/sys/kernel"}});
  std::filesystem::create_symlink(dir + "/gone", dir + "/dangling");
  int i = 0;
  for (const auto& c : cases) {
    const auto cfg = dir + "/bad" + std::to_string(i) + ".toml";
    write_text(cfg, c.toml);
    std::vector<std::string> args{binary(), "run", cfg, "--set", "run.out_dir=" + dir + "/run"};
    args.insert(args.end(), c.extra_args.begin(), c.extra_args.end());
    auto [code, out] = run(args, dir + "/bad" + std::to_string(i) + ".log", 120);
    CATCH_INFO("case " << i << " (" << c.key << "): " << out);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(c.key) != std::string::npos);
    CATCH_CHECK(count_lines_containing(out, "error") == 1);
    ++i;
  }
  // A config file that does not exist is a config error too.
  auto [code, out] = run({binary(), "run", dir + "/missing.toml"}, dir + "/missing.log", 60);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(out.find("missing.toml") != std::string::npos);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("comm.backend = nccl where this binary or machine cannot run it exits 2 saying why",
                "[process][config]") {
  const auto dir = scratch_dir("nccl");
  const auto cfg = quick_config_file(dir);
  // --dry-run first: a binary with NCCL on a GPU machine accepts it, and then there is nothing to test here.
  for (const std::string mode : {"--dry-run", "--fresh"}) {
    auto [code, out] =
        run({binary(), "run", cfg, "--set", "comm.backend=nccl", mode}, dir + "/nccl.log", 120);
    CATCH_INFO(mode << ": " << out);
    if (code == 0 && mode == "--dry-run") {
      std::cout << "LONGWAVE_TEST_SKIPPED: this binary has NCCL and this machine a GPU\n";
      std::filesystem::remove_all(dir);
      return;
    }
    CATCH_CHECK(code == 2);
    CATCH_CHECK(count_lines_containing(out, "error") == 1);
    // Either the build lacks NCCL or the machine lacks a GPU; the line says which, and what to use instead.
    const bool no_build =
        out.find("comm.backend = \"nccl\": this binary was built without NCCL (LONGWAVE_WITH_NCCL") !=
        std::string::npos;
    const bool no_gpu =
        out.find("comm.backend = \"nccl\": no usable GPU on this machine") != std::string::npos;
    CATCH_CHECK((no_build || no_gpu));
    CATCH_CHECK(out.find("use comm.backend = \"ring\"") != std::string::npos);
    CATCH_CHECK(!std::filesystem::exists(dir + "/run/checkpoints"));
  }
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("An out-of-memory error says so and names the settings to lower", "[process][config]") {
  // What run_training, the workers, the evaluator and the outer optimizer print for a std::bad_alloc,
  // whose own what() is only "std::bad_alloc".
  const std::string oom = longwave::describe(std::bad_alloc());
  CATCH_CHECK(oom.rfind("out of memory (std::bad_alloc): ", 0) == 0);
  CATCH_CHECK(oom.find("train.batch_size") != std::string::npos);
  CATCH_CHECK(longwave::describe(std::runtime_error("disk full")) == "disk full");
}

CATCH_TEST_CASE("bad arguments exit 2 naming the option, and errors go to stderr, progress to stdout",
                "[process][config]") {
  const auto dir = scratch_dir("badargs");
  const auto cfg = quick_config_file(dir);
  struct bad_case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<bad_case> cases = {
      // spdlog would take an unknown level as "off": every message silenced, errors included.
      {{"run", cfg, "--log-level", "verbose"}, "--log-level: verbose not in"},
      {{"presets", "--vocab", "0"}, "--vocab: 0 is not a whole number in [2, 65536]"},
      // Not "not in range" for what is no whole number; no hexadecimal either (0x10 was 16).
      {{"presets", "--vocab", "1e3"}, "--vocab: 1e3 is not a whole number in [2, 65536]"},
      {{"presets", "--seq-len", "0x10"}, "--seq-len: 0x10 is not a whole number in [8, 8192]"},
      // --leave starts nothing: it ignored these without a word.
      {{"node", cfg, "--node", "n0", "--leave", "--dry-run"}, "--dry-run excludes --leave"},
      {{"presets", "--seq-len", "-5"}, "--seq-len"},
      {{"keys", "new", "--out", "", "--nodes", "a"}, "--out is empty"},
      {{"keys", "new", "--out", dir + "/keys", "--nodes", "a,,b"}, "node name '': names are 1..32"},
      {{"keys", "new", "--out", dir + "/keys", "--nodes", "a", "--nodes", "b,a"},
       "node name 'a': given twice"},
      {{"eval", dir, "--batches", "0"}, "--batches: 0 is not a whole number of at least 1"},
      {{"run", "/dev/zero", "--dry-run"}, "not a regular file"},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::vector<std::string> args{binary()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto [code, out] = run(args, dir + "/arg" + std::to_string(i++) + ".log", 60);
    CATCH_INFO(c.says << ": " << out);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(c.says) != std::string::npos);
  }
  // A config error found after the config loaded (the device) goes to stderr: a dry run's resolved config
  // on stdout holds none of it.
  const auto [code, out] =
      run({"/bin/sh", "-c", "\"$0\" run \"$1\" --dry-run --set train.device=cuda:7 > \"$2\"", binary(), cfg,
           dir + "/resolved.toml"},
          dir + "/stderr.log", 60);
  CATCH_INFO(out);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(out.find("train.device") != std::string::npos);
  CATCH_CHECK(read_text(dir + "/resolved.toml").find("train.device") == std::string::npos);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("bad data exits with code 2 and one line naming the file, before any training",
                "[process][data]") {
  const auto dir = scratch_dir("baddata");
  std::mt19937 rng(5);
  auto noise = [&](size_t n) {
    std::string s(n, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng() & 0xFF);
    return s;
  };
  std::filesystem::create_directories(dir + "/shards");
  write_text(dir + "/empty.txt", "");
  write_text(dir + "/shards/train.bin", noise(8192));
  write_text(dir + "/shards/val.bin", noise(4096));
  write_text(dir + "/notext.jsonl", "{\"title\": \"a\", \"body\": \"no text field\"}\n");
  write_text(dir + "/corpus.txt", noise(64 * 1024));
  // Well-formed shards of the byte tokenizer, one id in val.bin beyond its 256: the model would index past
  // its embedding.
  auto shard = [](std::vector<uint16_t> tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520, header[1] = 1, header[2] = static_cast<int32_t>(tokens.size());
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    return bytes + std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  };
  std::vector<uint16_t> train(20000), val(4000);
  for (size_t k = 0; k < train.size(); ++k) train[k] = static_cast<uint16_t>((k * 31) % 256);
  for (size_t k = 0; k < val.size(); ++k) val[k] = static_cast<uint16_t>((k * 17) % 256);
  val[5] = 300;
  std::filesystem::create_directories(dir + "/ids");
  write_text(dir + "/ids/train.bin", shard(train));
  write_text(dir + "/ids/val.bin", shard(val));
  write_text(dir + "/ids/tokenizer.txt", "longwave-byte 1\n");
  struct bad_case {
    std::string data_path, names, says;
  };
  const std::vector<bad_case> cases = {
      {dir + "/empty.txt", dir + "/empty.txt", "is empty"},
      {dir + "/shards", dir + "/shards/train.bin", "bad magic"},
      {dir + "/notext.jsonl", dir + "/notext.jsonl:1", "no string field \"text\""},
      {dir + "/corpus.txt", dir + "/corpus.txt", "is not text"},
      {dir, dir, "has no train.bin and val.bin"},
      {dir + "/ids", dir + "/ids/val.bin", "token id 300 at position 5"},
      {dir + "/loop_a", dir + "/loop_a", "Too many levels of symbolic links"},  // was a raw exception, exit 1
  };
  std::filesystem::create_symlink(dir + "/loop_b", dir + "/loop_a");
  std::filesystem::create_symlink(dir + "/loop_a", dir + "/loop_b");
  int i = 0;
  for (const auto& c : cases) {
    const auto log = dir + "/case" + std::to_string(i) + ".log";
    auto [code, out] = run({binary(), "run", quick_config_file(dir), "--set", "data.path=" + c.data_path,
                            "--set", "data.cache_dir=" + dir + "/cache" + std::to_string(i)},
                           log, 120);
    CATCH_INFO("case " << i << " (" << c.data_path << "): " << out);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(c.names) != std::string::npos);
    CATCH_CHECK(count_lines_containing(out, c.says) == 1);
    CATCH_CHECK(out.find("| step") == std::string::npos);  // no training happened
    ++i;
  }
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("a FIFO where the run writes its files is refused before training, naming it",
                "[process][config]") {
  // A probe: a FIFO named loss_trace.tsv blocked the run before its first step, for good.
  const auto dir = scratch_dir("fifo");
  const auto cfg = quick_config_file(dir);
  std::filesystem::create_directories(dir + "/run");
  for (const std::string name : {"loss_trace.tsv", "metrics.jsonl"}) {
    const auto fifo = dir + "/run/" + name;
    CATCH_REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    auto [code, out] = run({binary(), "run", cfg}, dir + "/" + name + ".log", 120);
    CATCH_INFO(out);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(fifo + " is a FIFO (named pipe), not a file") != std::string::npos);
    std::filesystem::remove(fifo);
  }
  CATCH_CHECK_FALSE(std::filesystem::exists(dir + "/run/checkpoints/ckpt-00000000-0000000001.lwc"));
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("a dry run prints the resolved config and the parameter count without training",
                "[process][config]") {
  const auto dir = scratch_dir("dryrun");
  auto [code, out] =
      run({binary(), "run", quick_config_file(dir), "--dry-run", "--set", "model.preset=small"},
          dir + "/out.log", 120);
  CATCH_INFO(out);
  CATCH_CHECK(code == 0);
  CATCH_CHECK(out.find("parameters: 14260608") != std::string::npos);
  CATCH_CHECK(out.find("preset = \"small\"") != std::string::npos);
  CATCH_CHECK(out.find("memory estimate") != std::string::npos);
  CATCH_CHECK(out.find("this machine: ") != std::string::npos);
  CATCH_CHECK(out.find("is empty") == std::string::npos);
  CATCH_CHECK_FALSE(std::filesystem::exists(dir + "/run/checkpoints"));
  // train.threads = 0 shares OMP_NUM_THREADS (else the CPUs this process may use) among the workers.
  auto [tcode, threads] = run({"/usr/bin/env", "OMP_NUM_THREADS=6", binary(), "run", quick_config_file(dir),
                               "--dry-run", "--set", "train.workers=2"},
                              dir + "/threads.log", 120);
  CATCH_INFO(threads);
  CATCH_CHECK(tcode == 0);
  CATCH_CHECK(
      threads.find("torch threads: 3 per worker (train.threads = 0: 6 (OMP_NUM_THREADS) / 2 workers)") !=
      std::string::npos);
  // At most train.threads' bound (a probe: OMP_NUM_THREADS=2100 gave 1050 a worker).
  auto [omp_code, many] = run({"/usr/bin/env", "OMP_NUM_THREADS=2100", binary(), "run",
                               quick_config_file(dir), "--dry-run", "--set", "train.workers=2"},
                              dir + "/many.log", 120);
  CATCH_INFO(many);
  CATCH_CHECK(omp_code == 0);
  CATCH_CHECK(many.find("torch threads: 1024 per worker") != std::string::npos);
  // Tokens per worker past 64 bits are said so (the product overflowed).
  auto [bcode, big] = run({binary(), "run", quick_config_file(dir), "--dry-run", "--set",
                           "train.rounds=1000000000000", "--set", "train.inner_steps=1000000"},
                          dir + "/big.log", 120);
  CATCH_INFO(big);
  CATCH_CHECK(bcode == 0);
  CATCH_CHECK(big.find("1000000000000 rounds x H=1000000); tokens per worker: more than 2^63") !=
              std::string::npos);
  // A shard directory gives its tokenizer's vocabulary (the dry run said the byte tokenizer's 256), and one
  // without shards is refused by the dry run as by the run.
  write_text(dir + "/corpus.txt", std::string(20000, 'a') + "bcd efg hij\n");
  auto [pcode, prepared] = run({binary(), "data", "prepare", dir + "/corpus.txt", "--out", dir + "/shards",
                                "--tokenizer", "bpe", "--vocab", "260"},
                               dir + "/prepare.log", 120);
  CATCH_INFO(prepared);
  CATCH_REQUIRE(pcode == 0);
  auto [scode, shards] =
      run({binary(), "run", quick_config_file(dir), "--dry-run", "--set", "data.path=" + dir + "/shards"},
          dir + "/shards.log", 120);
  CATCH_INFO(shards);
  CATCH_CHECK(scode == 0);
  const auto vocab = prepared.substr(prepared.rfind("(vocab ") + 7);
  CATCH_CHECK(shards.find(", vocab " + vocab.substr(0, vocab.find(')')) + ", context") != std::string::npos);
  // Shards without a tokenizer.txt: their largest id bounds model.vocab_size, not data.tokenizer's 256 (a
  // probe: 200 was refused as smaller than the byte tokenizer's while 0 took 107).
  auto [byte_code, bytes] =
      run({binary(), "data", "prepare", dir + "/corpus.txt", "--out", dir + "/byte-shards"},
          dir + "/prepare-bytes.log", 120);
  CATCH_INFO(bytes);
  CATCH_REQUIRE(byte_code == 0);
  for (const char* f : {"tokenizer.txt", "prepared.txt"}) std::filesystem::remove(dir + "/byte-shards/" + f);
  for (const auto& [vocab_size, code_wanted] :
       std::vector<std::pair<std::string, int>>{{"200", 0}, {"100", 2}}) {
    auto [vcode, said] = run({binary(), "run", quick_config_file(dir), "--dry-run", "--set",
                              "data.path=" + dir + "/byte-shards", "--set", "model.vocab_size=" + vocab_size},
                             dir + "/byte-shards.log", 120);
    CATCH_INFO(said);
    CATCH_CHECK(vcode == code_wanted);
    CATCH_CHECK(said.find(code_wanted == 0 ? ", vocab 200, context"
                                           : "model.vocab_size = 100: the data has token ids up to 106") !=
                std::string::npos);
  }
  std::filesystem::create_directories(dir + "/no-shards");
  auto [ncode, none] =
      run({binary(), "run", quick_config_file(dir), "--dry-run", "--set", "data.path=" + dir + "/no-shards"},
          dir + "/none.log", 120);
  CATCH_INFO(none);
  CATCH_CHECK(ncode == 2);
  CATCH_CHECK(none.find("has no train.bin and val.bin") != std::string::npos);
  // A config file that sets nothing runs on the defaults, and says so.
  write_text(dir + "/empty.toml", "# nothing here\n");
  auto [ecode, empty] = run({binary(), "run", dir + "/empty.toml", "--dry-run"}, dir + "/empty.log", 120);
  CATCH_INFO(empty);
  CATCH_CHECK(ecode == 0);
  CATCH_CHECK(count_lines_containing(empty, dir + "/empty.toml is empty: every setting is its default") == 1);
  auto [hcode, help] = run({binary(), "run", "--help"}, dir + "/help.log", 60);
  CATCH_CHECK(hcode == 0);
  CATCH_CHECK(help.find("--dry-run") != std::string::npos);
  CATCH_CHECK(help.find("--set") != std::string::npos);
  auto [ucode, usage] = run({binary(), "frobnicate"}, dir + "/usage.log", 60);
  CATCH_CHECK(ucode == 2);
  CATCH_CHECK(usage.find("longwave: unknown command 'frobnicate' (see longwave --help)") !=
              std::string::npos);
  // With --help too: not the main help and exit 0.
  auto [uhcode, uhelp] = run({binary(), "nosuch", "--help"}, dir + "/usage_help.log", 60);
  CATCH_CHECK(uhcode == 2);
  CATCH_CHECK(uhelp.find("unknown command 'nosuch'") != std::string::npos);
  auto [mcode, mhelp] = run({binary(), "--help"}, dir + "/main_help.log", 60);
  CATCH_CHECK(mcode == 0);
  CATCH_CHECK(mhelp.find("presets") != std::string::npos);
  // data prepare: an input or --out that cannot be used is named before anything is read or written.
  write_text(dir + "/a-file", "x");
  std::filesystem::create_directories(dir + "/a-dir");
  std::filesystem::create_symlink(dir + "/gone", dir + "/dangling");
  for (const auto& [argv, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"data", "prepare", dir + "/nope.txt", "--out", dir + "/p"}, dir + "/nope.txt: no such file"},
           {{"data", "prepare", dir + "/a-dir", "--out", dir + "/p"}, dir + "/a-dir is a directory"},
           {{"data", "prepare", "--out", dir + "/a-file"}, "--out " + dir + "/a-file is not a directory"},
           {{"data", "prepare", "--out", ""}, "--out is empty"},
           {{"data", "prepare", dir + "/a-file", "--out", dir + "/p", "--val-fraction", "-1"},
            "--val-fraction -1 must be in (0, 0.5]"},
           {{"data", "prepare", dir + "/a-file", "--out", dir + "/p", "--val-fraction", "0.6"},
            "--val-fraction 0.6 must be in (0, 0.5], as data.val_fraction"},
           // As run and export say it (a probe: exit 1, "cannot create ...: File exists").
           {{"data", "prepare", dir + "/a-file", "--out", dir + "/dangling"},
            "--out " + dir + "/dangling: a symbolic link to " + dir + "/gone, which does not exist"},
           {{"data", "prepare", dir + "/a-file", "--out", dir + "/a-file/sub"},
            "--out " + dir + "/a-file/sub: " + dir + "/a-file is a file, not a directory"},
           // prepared.txt records paths a line each (a probe: a line break wrote a key of its own there).
           {{"data", "prepare", dir + "/a-file", "--out", dir + "/p\nvocab_size=9"},
            "--out: the path contains a line break (byte 0x0a at"}}) {
    std::vector<std::string> full{binary()};
    full.insert(full.end(), argv.begin(), argv.end());
    auto [pcode, plog] = run(full, dir + "/prepare.log", 60);
    CATCH_INFO(plog);
    CATCH_CHECK(pcode == 2);
    CATCH_CHECK(plog.find("data prepare: " + says) != std::string::npos);
  }
  // No input: the default corpus, which a fresh machine may lack (a probe: exit 1 and no hint).
  auto nokjv = spawn({binary(), "data", "prepare", "--out", dir + "/p"}, dir + "/nokjv.log", false,
                     {"LONGWAVE_CORPUS=" + dir + "/no-kjv.txt"});
  CATCH_CHECK(wait_exit(nokjv, 60) == 2);
  CATCH_CHECK(read_text(dir + "/nokjv.log")
                  .find("data prepare: the default corpus " + dir +
                        "/no-kjv.txt is missing: run scripts/setup") != std::string::npos);
  CATCH_CHECK_FALSE(std::filesystem::exists(dir + "/p"));
  // A preparation refused after its --out was made leaves no folder behind (a probe found one holding only
  // the lock file).
  write_text(dir + "/binary.dat", std::string(4096, '\0'));
  auto [bin_code, bin_log] =
      run({binary(), "data", "prepare", dir + "/binary.dat", "--out", dir + "/binout"}, dir + "/bin.log", 60);
  CATCH_INFO(bin_log);
  CATCH_CHECK(bin_code == 2);
  CATCH_CHECK(bin_log.find("is not text") != std::string::npos);
  CATCH_CHECK_FALSE(std::filesystem::exists(dir + "/binout"));
  // LONGWAVE_CORPUS naming shards: refused as a directory named as the input is (it said "done" and wrote
  // nothing).
  auto env_shards = spawn({binary(), "data", "prepare", "--out", dir + "/p"}, dir + "/shards.log", false,
                          {"LONGWAVE_CORPUS=" + dir + "/a-dir"});
  CATCH_CHECK(wait_exit(env_shards, 60) == 2);
  CATCH_CHECK(read_text(dir + "/shards.log")
                  .find("data prepare: the default corpus " + dir +
                        "/a-dir is a directory: llm.c shards are used as they are") != std::string::npos);
  // A command's unknown command, and an unknown option where a command is wanted, are named too.
  auto [dcode, dusage] = run({binary(), "data", "nosuch"}, dir + "/data_usage.log", 60);
  CATCH_CHECK(dcode == 2);
  CATCH_CHECK(dusage.find("longwave data: unknown command 'nosuch' (see longwave data --help)") !=
              std::string::npos);
  auto [ocode, ousage] = run({binary(), "--bogus"}, dir + "/option_usage.log", 60);
  CATCH_CHECK(ocode == 2);
  CATCH_CHECK(ousage.find("longwave: unknown option '--bogus' (see longwave --help)") != std::string::npos);
  for (const std::vector<std::string>& ok : {std::vector<std::string>{"--version"}, {"data", "--help"}}) {
    std::vector<std::string> argv{binary()};
    argv.insert(argv.end(), ok.begin(), ok.end());
    CATCH_CHECK(run(argv, dir + "/ok.log", 60).first == 0);
  }
  // --version names the commit built (git describe; "unknown" outside a git checkout) and the wire protocol.
  auto [vcode, vout] = run({binary(), "--version"}, dir + "/version.log", 60);
  CATCH_INFO(vout);
  CATCH_CHECK(vcode == 0);
  CATCH_CHECK(std::regex_search(vout, std::regex("^longwave \\S+ \\(wire protocol [0-9]+\\) on ")));
  // `longwave` alone (no longwave-torch beside it) still answers the commands that need no LibTorch, and
  // names the missing binary for the others.
  const auto alone = dir + "/alone";
  std::filesystem::create_directories(alone);
  std::filesystem::copy_file(binary(), alone + "/longwave");
  auto [acode, ahelp] = run({alone + "/longwave", "presets"}, dir + "/alone_presets.log", 60);
  CATCH_CHECK(acode == 0);
  CATCH_CHECK(ahelp.find("parameters") != std::string::npos);
  auto [rcode, rlog] = run({alone + "/longwave", "run", dir + "/empty.toml"}, dir + "/alone_run.log", 60);
  CATCH_INFO(rlog);
  CATCH_CHECK(rcode == 1);
  CATCH_CHECK(count_lines_containing(rlog, "longwave: cannot start " + alone + "/longwave-torch") == 1);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE(
    "a shape given over the preset trains, counts its parameters and refuses a resume as another shape",
    "[process][config]") {
  const auto dir = scratch_dir("shape");
  const auto cfg = quick_config_file(dir, "");
  // tiny with dim 128, 4 heads over 2 KV heads, 2 layers, ffn 256: 256*128 + 2*(2*128 + 2*128^2 +
  // 2*128*64 + 3*128*256) + 128 = 328320.
  const std::vector<std::string> shape{"--set", "model.dim=128",        "--set", "model.heads=4",
                                       "--set", "model.kv_heads=2",     "--set", "model.layers=2",
                                       "--set", "model.ffn_hidden=256", "--set", "train.rounds=2"};
  auto with = [&](std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  auto [dcode, dry] = run(with({binary(), "run", cfg, "--dry-run"}, shape), dir + "/dry.log", 120);
  CATCH_INFO(dry);
  CATCH_CHECK(dcode == 0);
  CATCH_CHECK(dry.find("parameters: 328320") != std::string::npos);
  CATCH_CHECK(dry.find("dim 128, layers 2, heads 4 (kv 2), ffn 256") != std::string::npos);
  CATCH_CHECK(dry.find("kv_heads = 2") != std::string::npos);  // the resolved config, as checkpoints store it
  auto [tcode, trained] = run(with({binary(), "run", cfg}, shape), dir + "/train.log", 300);
  CATCH_INFO(trained);
  CATCH_REQUIRE(tcode == 0);
  CATCH_CHECK(read_trace(dir + "/run/loss_trace.tsv").size() == 10);
  // Another shape with the same preset may not load these weights.
  auto other = shape;
  other[5] = "model.kv_heads=4";
  auto [rcode, refused] = run(with({binary(), "run", cfg}, other), dir + "/resume.log", 120);
  CATCH_INFO(refused);
  CATCH_CHECK(rcode != 0);
  CATCH_CHECK(refused.find("written for model 'tiny dim=128 layers=2 heads=4 kv_heads=2 ffn_hidden=256'") !=
              std::string::npos);
  // presets counts the same shape from the options or from a config.
  auto [pcode, table] = run({binary(), "presets", "--dim", "128", "--heads", "4", "--kv-heads", "2",
                             "--layers", "2", "--ffn-hidden", "256", "--seq-len", "64"},
                            dir + "/presets.log", 60);
  CATCH_INFO(table);
  CATCH_CHECK(pcode == 0);
  CATCH_CHECK(
      table.find("shape: tiny dim=128 layers=2 heads=4 kv_heads=2 ffn_hidden=256, 328320 parameters") !=
      std::string::npos);
  CATCH_CHECK(table.find("1b") != std::string::npos);
  auto [bcode, bad] = run({binary(), "presets", "--heads", "5"}, dir + "/presets_bad.log", 60);
  CATCH_CHECK(bcode == 2);
  CATCH_CHECK(bad.find("model.heads = 5") != std::string::npos);
  auto [kcode, kv] = run({binary(), "presets", "--kv-heads", "abc"}, dir + "/presets_dim.log", 60);
  CATCH_CHECK(kcode == 2);
  CATCH_CHECK(kv.find("expected an integer, got a string (from --kv-heads)") != std::string::npos);  // --set
  // A cluster file's model, as its nodes read it (it was refused as a config with a [cluster] section).
  write_text(
      dir + "/cluster.toml",
      "[cluster]\nid = \"p\"\ncoordinator = \"tcp://127.0.0.1:5600\"\n[[nodes]]\nname = \"a\"\n"
      "endpoint = \"tcp://127.0.0.1:5601\"\n[security]\nmode = \"none\"\n[model]\npreset = \"small\"\n");
  auto [ccode, clustered] =
      run({binary(), "presets", "--config", dir + "/cluster.toml"}, dir + "/presets_c.log", 60);
  CATCH_INFO(clustered);
  CATCH_CHECK(ccode == 0);
  CATCH_CHECK(clustered.find("shape: small, 14260608 parameters") != std::string::npos);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("/metrics can be scraped and parsed during a run", "[process][metrics]") {
  const auto dir = scratch_dir("metrics");
  const auto cfg = quick_config_file(dir, "");
  auto c = spawn({binary(), "run", cfg, "--set", "metrics.enabled=true", "--set", "metrics.port=0", "--set",
                  "train.rounds=1000000"},
                 dir + "/run.log");
  int port = 0;
  CATCH_REQUIRE(wait_until(
      [&] {
        std::smatch m;
        const auto log = read_text(dir + "/run.log");
        if (!std::regex_search(log, m, std::regex("127\\.0\\.0\\.1:([0-9]+)/metrics"))) return false;
        port = std::stoi(m[1]);
        return true;
      },
      120));
  // Wait for a few completed steps (the loss trace grows one line per step).
  CATCH_REQUIRE(wait_until([&] { return read_trace(dir + "/run/loss_trace.tsv").size() >= 12; }, 300));
  // A round and a checkpoint have completed once the outer round gauge moved.
  std::vector<longwave::test::prom_sample> samples;
  CATCH_REQUIRE(wait_until(
      [&] {
        samples = parse_prom_text(http_get(port, "/metrics"));
        const auto r = prom_find(samples, "longwave_outer_round");
        const auto ck = prom_find(samples, "longwave_checkpoints_total");
        return r && *r >= 1 && ck && *ck >= 1;
      },
      300));
  // Every series carries the node label: run.name, which defaults to the config file's stem.
  CATCH_CHECK(prom_value(samples, "longwave_outer_round", {{"node", "quick"}}).has_value());
  auto loss = prom_find(samples, "longwave_train_loss");
  CATCH_REQUIRE(loss.has_value());
  CATCH_CHECK(*loss > 0.5);
  CATCH_CHECK(*loss < 6.0);
  auto tps = prom_find(samples, "longwave_train_tokens_per_second");
  CATCH_REQUIRE(tps.has_value());
  CATCH_CHECK(*tps > 0);
  auto util = prom_find(samples, "longwave_compute_utilization_ratio");
  CATCH_REQUIRE(util.has_value());
  CATCH_CHECK(*util > 0.0);
  CATCH_CHECK(*util <= 1.0);
  for (const std::string w : {"0", "1"}) {
    CATCH_INFO("worker " << w);
    auto wu = prom_find(samples, "longwave_worker_compute_utilization_ratio", {{"worker", w}});
    CATCH_REQUIRE(wu.has_value());
    CATCH_CHECK(*wu > 0.0);
    CATCH_CHECK(*wu <= 1.0);
    auto steps = prom_find(samples, "longwave_worker_inner_steps_total", {{"worker", w}});
    CATCH_REQUIRE(steps.has_value());
    CATCH_CHECK(*steps >= 10);
    // The step-time histogram counted every step.
    CATCH_CHECK(prom_find(samples, "longwave_worker_inner_step_seconds_count", {{"worker", w}}) == *steps);
    CATCH_CHECK(prom_find(samples, "longwave_worker_idle_seconds_total", {{"worker", w}}).value_or(-1) >= 0);
    CATCH_CHECK(prom_find(samples, "longwave_worker_train_loss", {{"worker", w}}).value_or(0) > 0.5);
  }
  CATCH_CHECK(prom_find(samples, "longwave_allreduce_seconds_count").value_or(0) >= 1);
  CATCH_CHECK(prom_find(samples, "longwave_outer_pseudo_gradient_norm").value_or(0) > 0);
  CATCH_CHECK(prom_find(samples, "longwave_outer_update_norm").value_or(0) > 0);
  CATCH_CHECK(prom_find(samples, "longwave_inner_learning_rate").value_or(0) > 0);
  CATCH_CHECK(prom_find(samples, "longwave_checkpoint_bytes").value_or(0) > 1000);
  CATCH_CHECK(prom_find(samples, "longwave_checkpoint_last_success_timestamp_seconds").value_or(0) > 1.7e9);
  CATCH_CHECK(prom_find(samples, "longwave_build_info").value_or(0) == 1.0);
  kill(c.pid, SIGINT);
  CATCH_CHECK(wait_exit(c, 120) == 130);
  // The event log has the start, per-step, per-round and end lines.
  const auto events = read_text(dir + "/run/metrics.jsonl");
  for (const char* kind : {"start", "step", "worker", "allreduce", "outer", "checkpoint", "end"}) {
    CATCH_INFO("kind " << kind);
    CATCH_CHECK(events.find(std::string("{\"kind\":\"") + kind + "\"") != std::string::npos);
  }
  CATCH_CHECK(events.find("\"exit_code\":130") != std::string::npos);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("Ctrl-C flushes a checkpoint, exits 130, and the same command resumes to the end",
                "[process][resume]") {
  const auto dir = scratch_dir("sigint");
  const auto cfg = quick_config_file(dir, "");
  // The mechanics model: this test is about the stop and the resume, not about what the model learns. 500
  // steps leave the stop (after 12) as much time to land as 150 of the tiny model did.
  std::vector<std::string> cmd{binary(), "run", cfg, "--set", "train.rounds=100"};
  const auto model = mechanics_model_sets();
  cmd.insert(cmd.end(), model.begin(), model.end());
  auto c = spawn(cmd, dir + "/run1.log");
  CATCH_REQUIRE(wait_until([&] { return read_trace(dir + "/run/loss_trace.tsv").size() >= 12; }, 300));
  kill(c.pid, SIGINT);
  const int code = wait_exit(c, 120);
  const auto log1 = read_text(dir + "/run1.log");
  CATCH_INFO(log1);
  CATCH_REQUIRE(code == 130);
  const auto stop = log1.find("stopped at inner step ");
  CATCH_REQUIRE(stop != std::string::npos);
  const long stop_step = std::stol(log1.substr(stop + 22));
  const auto stopped_at = read_trace(dir + "/run/loss_trace.tsv").size();
  CATCH_CHECK(stopped_at < 500);
  // Resume: same command, finishes, and the trace covers every step once.
  auto [code2, log2] = run(cmd, dir + "/run2.log", 600);
  CATCH_INFO(log2);
  CATCH_CHECK(code2 == 0);
  // From the checkpoint the stop wrote, not an older one.
  const auto resume = log2.find("resuming from round");
  CATCH_REQUIRE(resume != std::string::npos);
  const auto step_at = log2.find(", inner step ", resume);
  CATCH_REQUIRE(step_at != std::string::npos);
  CATCH_CHECK(std::stol(log2.substr(step_at + 13)) == stop_step);
  auto trace = read_trace(dir + "/run/loss_trace.tsv");
  CATCH_REQUIRE(trace.size() == 500);
  for (size_t i = 0; i < trace.size(); ++i) CATCH_CHECK(trace[i].first == static_cast<long>(i + 1));
  CATCH_CHECK(log2.find("val perplexity") != std::string::npos);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("a stop signal while the run is set up exits 130 at once, saying nothing was trained",
                "[process][resume]") {
  const auto dir = scratch_dir("setup-signal");
  const auto data = dir + "/data";
  std::filesystem::create_directories(data);
  // The test holds the data directory's preparation lock, as another run preparing it would: the run waits
  // in its set-up, before any actor, until the signal comes.
  const int fd = ::open((data + "/.prepare.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CATCH_REQUIRE(fd >= 0);
  CATCH_REQUIRE(::flock(fd, LOCK_EX) == 0);
  for (const int sig : {SIGTERM, SIGINT}) {
    const auto log = dir + "/run" + std::to_string(sig) + ".log";
    auto c = spawn({binary(), "run", quick_config_file(dir), "--set", "data.cache_dir=" + data}, log);
    CATCH_REQUIRE(wait_for_text(log, "another process is preparing " + data, 120));
    ::kill(c.pid, sig);
    CATCH_INFO(read_text(log));
    CATCH_CHECK(wait_exit(c, 60) == 130);  // SIGTERM ended it with 143, unsaid
    CATCH_CHECK(read_text(log).find("stopped before training began: nothing to save") != std::string::npos);
  }
  ::close(fd);
  CATCH_CHECK_FALSE(std::filesystem::exists(dir + "/run/loss_trace.tsv"));  // nothing trained
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("a pace the device cannot keep is named: its steps take longer than train.pace_step_s",
                "[process][pace]") {
  const auto dir = scratch_dir("pace_too_fast");
  const auto cfg = quick_config_file(dir, "");
  // 0.1 ms a step: no device computes a step that fast, so every paced step is late.
  std::vector<std::string> cmd{
      binary(), "run", cfg, "--set", "train.rounds=2", "--set", "train.pace_step_s=0.0001"};
  const auto model = mechanics_model_sets();
  cmd.insert(cmd.end(), model.begin(), model.end());
  auto [code, log] = run(cmd, dir + "/run.log", 600);
  CATCH_INFO(log);
  CATCH_CHECK(code == 0);
  CATCH_CHECK(log.find("against its paced 0.0001 s (train.pace_step_s / speed)") != std::string::npos);
  CATCH_CHECK(log.find("this device, not the pace, sets the rate") != std::string::npos);
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("A metrics port already in use stops the run at start-up with a line naming the port",
                "[process][metrics]") {
  const auto dir = scratch_dir("port_in_use");
  const auto cfg = quick_config_file(dir, "");
  const held_port held;
  const int port = held.port;
  auto [code, out] = run({binary(), "run", cfg, "--set", "metrics.enabled=true", "--set",
                          "metrics.port=" + std::to_string(port)},
                         dir + "/run.log", 120);
  CATCH_CHECK(code == 2);  // the config's to change (or the run was started twice): it was exit 1
  CATCH_CHECK(out.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CATCH_CHECK(out.find("in use (is this run or cluster already running?)") != std::string::npos);
  CATCH_CHECK(out.find("| step") == std::string::npos);  // no training happened
  CATCH_CHECK(out.find("data: ") == std::string::npos);  // nor was the corpus prepared before it failed
  std::filesystem::remove_all(dir);
}

CATCH_TEST_CASE("keys new --cluster again after a node was added keys that node and keeps the others' keys",
                "[process][security]") {
  const auto dir = scratch_dir("keys_added_node");
  const auto keys = dir + "/k";
  const auto file = dir + "/c.toml";
  const auto nodes = [&](int n) {
    std::string text = "[cluster]\nid = \"k\"\ncoordinator = \"tcp://127.0.0.1:5555\"\n";
    for (int i = 0; i < n; ++i)
      text += "[[nodes]]\nname = \"n" + std::to_string(i) +
              "\"\nendpoint = \"tcp://127.0.0.1:" + std::to_string(5600 + i) + "\"\n";
    write_text(file, text);
  };
  nodes(2);
  auto [c1, o1] = run({binary(), "keys", "new", "--out", keys, "--cluster", file}, dir + "/1.log", 60);
  CATCH_INFO(o1);
  CATCH_REQUIRE(c1 == 0);
  const auto n0 = read_text(keys + "/nodes/n0.secret");
  nodes(3);  // it refused every node, advising to delete n0's and n1's keys
  auto [c2, o2] = run({binary(), "keys", "new", "--out", keys, "--cluster", file}, dir + "/2.log", 60);
  CATCH_INFO(o2);
  CATCH_CHECK(c2 == 0);
  CATCH_CHECK(o2.find("node n0: keyed already (kept)") != std::string::npos);
  CATCH_CHECK(o2.find("wrote " + keys + "/nodes/n2.secret") != std::string::npos);
  CATCH_CHECK(read_text(keys + "/nodes/n0.secret") == n0);
  auto [c3, o3] = run({binary(), "keys", "new", "--out", keys, "--cluster", file}, dir + "/3.log", 60);
  CATCH_INFO(o3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(o3.find("no node key written") != std::string::npos);
  CATCH_CHECK(o3.find("wrote") == std::string::npos);
  // A lost cluster.public is made again from cluster.secret, the same key.
  const auto cluster_public = read_text(keys + "/cluster.public");
  std::filesystem::remove(keys + "/cluster.public");
  auto [c4, o4] = run({binary(), "keys", "new", "--out", keys, "--cluster", file}, dir + "/4.log", 60);
  CATCH_INFO(o4);
  CATCH_CHECK(c4 == 0);
  CATCH_CHECK(o4.find("wrote " + keys + "/cluster.public") != std::string::npos);
  CATCH_CHECK(read_text(keys + "/cluster.public") == cluster_public);
  std::filesystem::remove_all(dir);
}
