// Exact resume after SIGKILL, and fallback from a corrupted checkpoint, with the real binary.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

#include "runtime/checkpoint/checkpoint_store.hpp"
#include "tests/support/json.hpp"
#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

std::string config_file(const std::string& dir, const std::string& name) {
  const auto path = dir + "/" + name + ".toml";
  write_text(path, "[run]\nout_dir = \"" + dir + "/" + name + "\"\nseed = 99\n[model]\nseq_len = 64\n" +
                       mechanics_model + R"(
[train]
workers = 2
inner_steps = 5
rounds = 12
batch_size = 8
warmup_steps = 5
threads = 1
[eval]
every_rounds = 0
batches = 2
[checkpoint]
every_rounds = 1
keep = 3
[metrics]
enabled = false
)");
  return path;
}

/// The corpus a run without data.path reads (models::data::default_corpus_path, as the binary finds it).
std::string default_corpus() {
  if (const char* c = std::getenv("LONGWAVE_CORPUS"); c && *c) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/longwave/kjv.txt";
  return std::string(std::getenv("HOME")) + "/.cache/longwave/kjv.txt";
}

std::vector<std::string> checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".lwc") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The log line of round r's evaluation (a run of 12 rounds).
std::string fmt_eval_line(long r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "eval  %3ld/12 |", r);
  return buf;
}

/// The first number after `prefix` in text, or -1.
long number_after(const std::string& text, const std::string& prefix) {
  const auto pos = text.find(prefix);
  return pos == std::string::npos ? -1 : std::stol(text.substr(pos + prefix.size()));
}

/// Runs the config uninterrupted, then again interrupted by `signal` inside a later round and restarted; the
/// loss traces and the final validation loss must agree. `extra` are --set overrides for both runs. SIGINT
/// must end the first run with 130 after saving, and the restart must resume from that very step; SIGKILL
/// leaves only the checkpoints written so far. round_steps > 0 (SIGINT only): aim the signal at the first
/// quarter of a round of that many steps, so that the stop comes mid-round, and check that it was saved as
/// such.
void check_interrupted_resume(const std::string& dir, const std::vector<std::string>& extra, int signal,
                              long round_steps = 0) {
  auto with = [&](std::vector<std::string> args) {
    for (const auto& e : extra) args.insert(args.end(), {"--set", e});
    // LW_TEST_DEVICE=cuda (scripts/gpu-check): the same check on a GPU, in deterministic mode.
    if (const char* device = std::getenv("LW_TEST_DEVICE"); device && *device)
      args.insert(args.end(),
                  {"--set", std::string("train.device=") + device, "--set", "train.deterministic=true"});
    return args;
  };
  // Uninterrupted reference.
  auto [code_a, log_a] = run(with({binary(), "run", config_file(dir, "a")}), dir + "/a.log", 600);
  CATCH_INFO(log_a);
  CATCH_REQUIRE(code_a == 0);
  auto trace_a = read_trace(dir + "/a/loss_trace.tsv");
  CATCH_REQUIRE(trace_a.size() == 60);

  // Same config, killed after at least 3 checkpointed rounds, somewhere inside a later round.
  const auto cfg_b = config_file(dir, "b");
  auto c = spawn(with({binary(), "run", cfg_b}), dir + "/b1.log");
  CATCH_REQUIRE(wait_until(
      [&] {
        const auto n = static_cast<long>(read_trace(dir + "/b/loss_trace.tsv").size());
        // In a round's first quarter: a window of several steps, which a loaded machine's slow poll still
        // hits, and early enough that the stop lands before streaming's mid-round sync.
        return n >= 17 && (round_steps == 0 || (n % round_steps >= 1 && n % round_steps <= round_steps / 4));
      },
      300, 5));
  CATCH_REQUIRE(kill(c.pid, signal) == 0);
  CATCH_CHECK(wait_exit(c, 120) == (signal == SIGKILL ? 128 + SIGKILL : 130));
  const auto killed_at = read_trace(dir + "/b/loss_trace.tsv").size();
  CATCH_REQUIRE(killed_at < 60);  // it really was interrupted
  CATCH_REQUIRE_FALSE(checkpoints(dir + "/b/checkpoints").empty());
  long stopped_at = -1;
  if (signal == SIGINT) {
    const auto log_b1 = read_text(dir + "/b1.log");
    CATCH_INFO(log_b1);
    stopped_at = number_after(log_b1, "stopped at inner step ");
    CATCH_REQUIRE(stopped_at > 0);
    if (round_steps > 0 && stopped_at % round_steps == 0)
      CATCH_WARN("the stop landed on a round boundary (step " << stopped_at << "); mid-round not exercised");
    else if (round_steps > 0)
      CATCH_CHECK(log_b1.find("(mid-round)") != std::string::npos);
  }

  auto [code_b, log_b] = run(with({binary(), "run", cfg_b}), dir + "/b2.log", 600);
  CATCH_INFO(log_b);
  CATCH_REQUIRE(code_b == 0);
  CATCH_CHECK(log_b.find("resuming from round") != std::string::npos);
  if (signal == SIGINT) {  // from the checkpoint the stop wrote, not an older one
    const auto resume = log_b.find("resuming from round");
    CATCH_CHECK(number_after(log_b.substr(resume == std::string::npos ? 0 : resume), ", inner step ") ==
                stopped_at);
  }
  auto trace_b = read_trace(dir + "/b/loss_trace.tsv");
  CATCH_REQUIRE(trace_b.size() == trace_a.size());
  for (size_t i = 0; i < trace_a.size(); ++i) {
    CATCH_CHECK(trace_b[i].first == trace_a[i].first);
    CATCH_CHECK(std::abs(trace_b[i].second - trace_a[i].second) <= 1e-6);
  }
  auto val_loss = [](const std::string& result) {
    const auto text = read_text(result);
    const auto pos = text.find("\"val_loss\": ");
    CATCH_REQUIRE(pos != std::string::npos);
    return std::stod(text.substr(pos + 12));
  };
  CATCH_CHECK(std::abs(val_loss(dir + "/a/result.json") - val_loss(dir + "/b/result.json")) <= 1e-6);
  // The token count covers the whole run, not only the session after the resume.
  auto tokens = [](const std::string& result) {
    const auto text = read_text(result);
    const auto pos = text.find("\"tokens\": ");
    CATCH_REQUIRE(pos != std::string::npos);
    return std::stoll(text.substr(pos + 10));
  };
  CATCH_CHECK(tokens(dir + "/b/result.json") == tokens(dir + "/a/result.json"));
}

}  // namespace

CATCH_TEST_CASE("a run SIGKILLed mid-way and restarted has the loss trace of an uninterrupted run",
                "[process][resume]") {
  const auto dir = scratch_dir("sigkill");
  check_interrupted_resume(dir, {}, SIGKILL);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a run whose terminal closes (SIGHUP) stops with a checkpoint, exit 130, and resumes exactly",
                "[process][resume]") {
  const auto dir = scratch_dir("sighup");
  check_interrupted_resume(dir, {}, SIGHUP);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a run whose output pipe loses its reader (| head) stops with a checkpoint and resumes exactly",
    "[process][resume]") {
  const auto dir = scratch_dir("closed-pipe");
  const auto cfg = config_file(dir, "r");
  auto [code_a, log_a] = run({binary(), "run", config_file(dir, "a")}, dir + "/a.log", 600);
  CATCH_REQUIRE(code_a == 0);
  // Paced, so that the reader goes while the run trains, whatever the machine's speed.
  auto [c, out] = spawn_piped({binary(), "run", cfg, "--set", "train.pace_step_s=0.05"});
  CATCH_REQUIRE(out >= 0);
  std::string head;
  char buf[4096];
  while (read_trace(dir + "/r/loss_trace.tsv").size() < 17) {  // in round 4, 3 checkpoints written
    const auto n = read(out, buf, sizeof buf);
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  close(out);  // the reader is gone: the next line the run writes meets a closed pipe
  CATCH_INFO(head);
  CATCH_CHECK(wait_exit(c, 120) == 130);  // not 141, killed by SIGPIPE
  const auto stopped = read_trace(dir + "/r/loss_trace.tsv").size();
  CATCH_REQUIRE(stopped < 60);
  CATCH_CHECK(read_text(dir + "/r/metrics.jsonl").find("\"exit_code\":130") != std::string::npos);
  // The stop saved its step: the rerun resumes from it, and ends as the uninterrupted run did.
  auto [code_b, log_b] = run({binary(), "run", cfg}, dir + "/b.log", 600);
  CATCH_INFO(log_b);
  CATCH_REQUIRE(code_b == 0);
  CATCH_CHECK(number_after(log_b, ", inner step ") == static_cast<long>(stopped));
  const auto trace_a = read_trace(dir + "/a/loss_trace.tsv"), trace_b = read_trace(dir + "/r/loss_trace.tsv");
  CATCH_REQUIRE(trace_b.size() == trace_a.size());
  for (size_t i = 0; i < trace_a.size(); ++i)
    CATCH_CHECK(std::abs(trace_b[i].second - trace_a[i].second) <= 1e-6);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a hangup sent twice still stops with a checkpoint, and under nohup a hangup is ignored",
                "[process][resume]") {
  const auto dir = scratch_dir("sighup-twice");
  const auto cfg = config_file(dir, "r");
  const std::vector<std::string> paced{binary(), "run", cfg, "--set", "train.pace_step_s=0.2"};
  auto a = spawn(paced, dir + "/a.log");
  CATCH_REQUIRE(wait_for_text(dir + "/a.log", "step", 300));
  CATCH_REQUIRE(kill(a.pid, SIGHUP) == 0);  // a closing terminal: bash's, then the kernel's
  CATCH_REQUIRE(wait_for_text(dir + "/a.log", "interrupt: finishing the current inner step", 60));
  CATCH_REQUIRE(kill(a.pid, SIGHUP) == 0);
  // And once more while the process ends (a zombie by then takes it without effect).
  CATCH_REQUIRE(wait_for_text(dir + "/a.log", "stopped at inner step", 120));
  kill(a.pid, SIGHUP);
  CATCH_CHECK(wait_exit(a, 120) == 130);
  const auto a_log = read_text(dir + "/a.log");
  CATCH_INFO(a_log);
  CATCH_CHECK(a_log.find("second interrupt") == std::string::npos);
  CATCH_CHECK(a_log.find("stopped at inner step") != std::string::npos);
  // nohup: SIGHUP stays ignored; Ctrl-C still stops it.
  std::vector<std::string> under_nohup{"/usr/bin/nohup"};
  under_nohup.insert(under_nohup.end(), paced.begin(), paced.end());
  auto b = spawn(under_nohup, dir + "/b.log");
  CATCH_REQUIRE(wait_for_text(dir + "/b.log", "resuming from round", 300));
  CATCH_REQUIRE(kill(b.pid, SIGHUP) == 0);
  const auto at_hangup = read_trace(dir + "/r/loss_trace.tsv").size();
  CATCH_REQUIRE(
      wait_until([&] { return read_trace(dir + "/r/loss_trace.tsv").size() >= at_hangup + 3; }, 120));
  CATCH_CHECK(read_text(dir + "/b.log").find("interrupt:") == std::string::npos);  // it trains on
  CATCH_REQUIRE(kill(b.pid, SIGINT) == 0);
  CATCH_CHECK(wait_exit(b, 120) == 130);
  const auto b_log = read_text(dir + "/b.log");
  CATCH_INFO(b_log);
  CATCH_CHECK(occurrences(b_log, "interrupt: finishing the current inner step") == 1);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("with delayed outer steps a run SIGKILLed mid-way resumes exactly, pending average included",
                "[process][resume][policy]") {
  const auto dir = scratch_dir("sigkill-delayed");
  check_interrupted_resume(dir, {"diloco.outer=delayed"}, SIGKILL);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "with eager outer steps a run SIGKILLed mid-way resumes exactly, per-worker outer state included",
    "[process][resume][policy]") {
  const auto dir = scratch_dir("sigkill-eager");
  check_interrupted_resume(dir, {"diloco.outer=eager"}, SIGKILL);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "with int8 and error feedback one process SIGKILLed mid-way resumes exactly, residual included",
    "[process][resume]") {
  // The residual was checkpointed only on cluster nodes: one process resumed from zero, silently.
  const auto dir = scratch_dir("sigkill-int8-ef");
  check_interrupted_resume(dir, {"comm.dtype=int8", "comm.error_feedback=true"}, SIGKILL);
  fs::remove_all(dir);
}

// Streaming: H = 6 and P = 2 (events at inner steps 2, 3, 5 and 6 of each round), 10 rounds = 60 steps.
const std::vector<std::string> streaming_sets{"diloco.outer=streaming", "diloco.fragments=2", "diloco.tau=1",
                                              "train.inner_steps=6", "train.rounds=10"};

CATCH_TEST_CASE("with streaming a run SIGKILLed mid-way resumes exactly", "[process][resume][policy]") {
  const auto dir = scratch_dir("sigkill-streaming");
  check_interrupted_resume(dir, streaming_sets, SIGKILL);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("with streaming Ctrl-C stops after a fragment sync, mid-round, and the resume is exact",
                "[process][resume][policy]") {
  const auto dir = scratch_dir("sigint-streaming");
  // H = 20 (fragment 1 synced at step 10): the run notices a signal within 0.1 s, about 4 steps here, so the
  // signal, sent as a round starts, reaches it before the mid-round sync.
  check_interrupted_resume(dir,
                           {"diloco.outer=streaming", "diloco.fragments=2", "diloco.tau=1",
                            "train.inner_steps=20", "train.rounds=3"},
                           SIGINT, /*round_steps=*/20);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a corrupted newest checkpoint is detected by its checksum and the previous one is used",
                "[process][resume]") {
  const auto dir = scratch_dir("corrupt");
  const auto cfg = config_file(dir, "r");
  auto [code, log] = run({binary(), "run", cfg, "--set", "train.rounds=4"}, dir + "/1.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  auto files = checkpoints(dir + "/r/checkpoints");
  CATCH_REQUIRE(files.size() == 3);  // keep = 3
  // Flip one byte in the middle of the newest checkpoint.
  {
    std::fstream f(files.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = static_cast<long>(f.tellg());
    f.seekg(size / 2);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(size / 2);
    f.write(&b, 1);
  }
  // Offline eval of the directory falls back too.
  auto [ecode, elog] = run({binary(), "eval", dir + "/r/checkpoints"}, dir + "/eval.log", 300);
  CATCH_INFO(elog);
  CATCH_CHECK(ecode == 0);
  CATCH_CHECK(elog.find("corrupt") != std::string::npos);
  CATCH_CHECK(elog.find("round 3") != std::string::npos);
  CATCH_CHECK(elog.find("val perplexity") != std::string::npos);
  CATCH_CHECK(fs::exists(files.back()));  // eval reads; only a training start moves a corrupt file aside
  // Continuing the run (more rounds) resumes from round 3 with a clear log line.
  auto [code2, log2] = run({binary(), "run", cfg, "--set", "train.rounds=6"}, dir + "/2.log", 600);
  CATCH_INFO(log2);
  CATCH_CHECK(code2 == 0);
  CATCH_CHECK(log2.find("checksum mismatch") != std::string::npos);
  CATCH_CHECK(log2.find("falling back") != std::string::npos);
  CATCH_CHECK(log2.find("resuming from round 3") != std::string::npos);
  CATCH_CHECK(fs::exists(dir + "/r/checkpoints/corrupt/" + fs::path(files.back()).filename().string()));
  // A newer file whose checksum holds but whose theta is NaN, which no run writes: eval of the directory and
  // the run fall back to round 6 (the run diverged from it, eval refused it); the run moves it aside.
  {
    using longwave::runtime::checkpoint_store;
    auto c = checkpoint_store::load_file(checkpoints(dir + "/r/checkpoints").back());
    CATCH_REQUIRE(c.round == 6);
    for (auto& b : c.blobs)
      if (b.name == "theta") b.storage[3] = static_cast<char>(0x7f), b.storage[2] = static_cast<char>(0xc0);
    c.step += c.step / c.round;
    c.round = 7;
    const auto nan_file =
        fs::path(checkpoint_store(dir + "/r/checkpoints", 100).write(c)).filename().string();
    auto [code6, log6] = run({binary(), "eval", dir + "/r/checkpoints"}, dir + "/6.log", 300);
    CATCH_INFO(log6);
    CATCH_CHECK(code6 == 0);
    CATCH_CHECK(log6.find("holds NaN or infinite values") != std::string::npos);
    CATCH_CHECK(log6.find("round 6") != std::string::npos);
    auto [code7, log7] = run({binary(), "run", cfg, "--set", "train.rounds=6"}, dir + "/7.log", 600);
    CATCH_INFO(log7);
    CATCH_CHECK(code7 == 0);
    CATCH_CHECK(log7.find("'theta' holds NaN or infinite values, which no run writes") != std::string::npos);
    CATCH_CHECK(fs::exists(dir + "/r/checkpoints/corrupt/" + nan_file));
  }
  // A truncated checkpoint: detected as well.
  files = checkpoints(dir + "/r/checkpoints");
  fs::resize_file(files.back(), fs::file_size(files.back()) / 3);
  auto [code3, log3] = run({binary(), "eval", files.back()}, dir + "/3.log", 300);
  CATCH_INFO(log3);
  CATCH_CHECK(code3 == 2);  // bad input, as export says
  CATCH_CHECK(log3.find("corrupt") != std::string::npos);
  auto [code4, log4] = run({binary(), "export", files.back(), "--out", dir + "/hf"}, dir + "/4.log", 300);
  CATCH_INFO(log4);
  CATCH_CHECK(code4 == 2);
  // A path that is not there, and a directory without a checkpoint: bad input too, named.
  fs::create_directories(dir + "/none");
  for (const auto& missing : {dir + "/nope.lwc", dir + "/none"}) {
    auto [code5, log5] = run({binary(), "eval", missing}, dir + "/5.log", 300);
    CATCH_INFO(log5);
    CATCH_CHECK(code5 == 2);
    CATCH_CHECK(log5.find(missing + ": no") != std::string::npos);
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "with checkpoint.keep = 1 a failed write keeps the checkpoint the run resumed from, not a newer one it "
    "refused",
    "[process][resume]") {
  using longwave::runtime::checkpoint_store;
  const auto dir = scratch_dir("keep-one");
  const auto cfg = config_file(dir, "r");
  const auto ckpt = dir + "/r/checkpoints";
  auto [code, log] = run({binary(), "run", cfg, "--set", "train.rounds=2", "--set", "checkpoint.keep=1"},
                         dir + "/1.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  const auto files = checkpoints(ckpt);
  CATCH_REQUIRE(files.size() == 1);
  const auto resumed = files.front();
  // A newer file whose checksum holds but whose counters no run writes: the resume refuses it.
  auto c = checkpoint_store::load_file(resumed);
  const uint64_t round_steps = c.step / c.round;
  for (auto& b : c.blobs)
    if (b.name == "replica0/counters") b.storage[7] = static_cast<char>(0x80);  // adam_steps < 0
  c.round = 5;
  c.step = 5 * round_steps;
  const auto refused = fs::path(checkpoint_store(ckpt, 100).write(c)).filename().string();
  // Round 3's write fails, as on a full disk: its temporary file's name is a directory, one that the start's
  // removal of unfinished writes leaves (it is not empty).
  const auto blocked = checkpoint_store(ckpt, 100).path_of(3, 3 * round_steps) + ".tmp";
  fs::create_directories(blocked + "/inside");
  const std::vector<std::string> again = {binary(),           "run", cfg, "--set", "train.rounds=3", "--set",
                                          "checkpoint.keep=1"};
  auto [code2, log2] = run(again, dir + "/2.log", 600);
  CATCH_INFO(log2);
  CATCH_CHECK(code2 != 0);
  CATCH_CHECK(log2.find("does not fit this run") != std::string::npos);
  CATCH_CHECK(log2.find("resuming from round 2") != std::string::npos);
  CATCH_CHECK(fs::exists(resumed));
  CATCH_CHECK(fs::exists(ckpt + "/corrupt/" + refused));  // kept for a person, out of every later start's way
  // With the disk mended, the run resumes from it and finishes.
  fs::remove_all(blocked);
  auto [code3, log3] = run(again, dir + "/3.log", 600);
  CATCH_INFO(log3);
  CATCH_CHECK(code3 == 0);
  CATCH_CHECK(log3.find("resuming from round 2") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a run whose out_dir is deleted under it stops at its next checkpoint with exit 3 and writes nothing "
    "into "
    "the new run's directory",
    "[process][resume][lock]") {
  const auto dir = scratch_dir("lost-dir");
  const auto cfg = config_file(dir, "r");
  // A: paced, 5 steps of 0.2 s a round, a checkpoint each round.
  auto a = spawn({binary(), "run", cfg, "--set", "train.pace_step_s=0.2"}, dir + "/a.log");
  CATCH_REQUIRE(wait_until([&] { return !checkpoints(dir + "/r/checkpoints").empty(); }, 300));
  fs::remove_all(dir + "/r");
  // B: the same out_dir, another learning rate, two quick rounds.
  auto [b_code, b_log] =
      run({binary(), "run", cfg, "--set", "train.lr=0.001", "--set", "train.rounds=2"}, dir + "/b.log", 600);
  CATCH_INFO(b_log);
  CATCH_CHECK(b_code == 0);
  CATCH_CHECK(wait_exit(a, 300) == 3);
  const auto a_log = read_text(dir + "/a.log");
  CATCH_INFO(a_log);
  CATCH_CHECK(a_log.find("no longer holds its directory") != std::string::npos);
  CATCH_CHECK(a_log.find("newest checkpoint on disk: unknown") != std::string::npos);
  const auto files = checkpoints(dir + "/r/checkpoints");
  CATCH_CHECK(files.size() == 2);
  for (const auto& f : files) {
    CATCH_INFO(f);
    const auto bytes = read_text(f);
    CATCH_CHECK(bytes.find("lr = 0.001") != std::string::npos);  // B's config in its meta, never A's
    CATCH_CHECK(bytes.find("lr = 0.004") == std::string::npos);
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a resume on data other than the checkpoint's run read says so", "[process][resume]") {
  const auto dir = scratch_dir("other-data");
  const auto cfg = config_file(dir, "r");
  const std::string corpus = default_corpus();
  fs::copy_file(corpus, dir + "/corpus.txt");
  const std::vector<std::string> args{binary(), "run", cfg, "--set", "data.path=\"" + dir + "/corpus.txt\""};
  auto with_rounds = [&](int rounds) {
    auto a = args;
    a.insert(a.end(), {"--set", "train.rounds=" + std::to_string(rounds)});
    return a;
  };
  auto [c1, l1] = run(with_rounds(1), dir + "/1.log", 600);
  CATCH_INFO(l1);
  CATCH_REQUIRE(c1 == 0);
  auto [c2, l2] = run(with_rounds(2), dir + "/2.log", 600);  // the same data: no word
  CATCH_INFO(l2);
  CATCH_REQUIRE(c2 == 0);
  CATCH_CHECK(l2.find("differs from what the checkpoint's run read") == std::string::npos);
  CATCH_CHECK(l2.find("no longer an exact resume") == std::string::npos);  // train.rounds may grow
  fs::resize_file(dir + "/corpus.txt", fs::file_size(dir + "/corpus.txt") / 2);
  // Run from the run's resolved copy: it sets every key, and none is named inert; the copy stays as it is.
  const auto copy = dir + "/r/config.toml";
  const auto copy_text = read_text(copy);
  auto [c3, l3] = run({binary(), "run", copy, "--set", "train.rounds=3"}, dir + "/3.log", 600);
  CATCH_INFO(l3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(l3.find("is set, but") == std::string::npos);
  CATCH_CHECK(l3.find(copy + " is the config file this run reads: left as it is") != std::string::npos);
  CATCH_CHECK(read_text(copy) == copy_text);
  CATCH_CHECK(l3.find("data: the training data (" + dir +
                      "/corpus.txt) differs from what the checkpoint's run "
                      "read") != std::string::npos);
  // --fresh names what it removes, and the run starts over: one round's trace.
  const auto one_round = read_trace(dir + "/r/loss_trace.tsv").size() / 3;
  auto fresh = with_rounds(1);
  fresh.push_back("--fresh");
  auto [c4, l4] = run(fresh, dir + "/4.log", 600);
  CATCH_INFO(l4);
  CATCH_CHECK(c4 == 0);
  CATCH_CHECK(l4.find(" checkpoints in " + dir +
                      "/r/checkpoints, loss_trace.tsv, result.json, metrics.jsonl") != std::string::npos);
  CATCH_CHECK(read_trace(dir + "/r/loss_trace.tsv").size() == one_round);
  fs::remove_all(dir);
}

namespace {

/// Runs `args` (a run writing DIR/r), interrupts it with Ctrl-C once 3 steps are traced, and returns the
/// inner step it stopped at (its exit 130 required).
long interrupt_after_3_steps(const std::string& dir, const std::vector<std::string>& args) {
  auto a = spawn(args, dir + "/a.log");
  CATCH_REQUIRE(wait_until([&] { return read_trace(dir + "/r/loss_trace.tsv").size() >= 3; }, 300));
  CATCH_REQUIRE(kill(a.pid, SIGINT) == 0);
  CATCH_REQUIRE(wait_exit(a, 120) == 130);
  const auto a_log = read_text(dir + "/a.log");
  CATCH_INFO(a_log);
  const long stopped_at = number_after(a_log, "stopped at inner step ");
  CATCH_REQUIRE(stopped_at >= 3);
  return stopped_at;
}

/// A run of 2 rounds trained to its end in dir/r (config_file's, a checkpoint each round). Returns its
/// config.
std::string finished_run(const std::string& dir) {
  const auto cfg = config_file(dir, "r");
  auto [code, log] = run({binary(), "run", cfg, "--set", "train.rounds=2"}, dir + "/a.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  return cfg;
}

}  // namespace

CATCH_TEST_CASE("a resume under other training settings, or past a lowered train.inner_steps, says so",
                "[process][resume]") {
  const auto dir = scratch_dir("other-settings");
  const auto cfg = config_file(dir, "r");
  // Stopped a few steps into a round of 1000: a mid-round checkpoint, whatever the machine's speed.
  const long stopped_at = interrupt_after_3_steps(
      dir,
      {binary(), "run", cfg, "--fresh", "--set", "train.inner_steps=1000", "--set", "train.pace_step_s=0.1"});
  // Started with --fresh, which would start over again: the stop says to leave it out (a probe).
  CATCH_CHECK(
      read_text(dir + "/a.log").find("run the same command without --fresh (which starts over) to resume") !=
      std::string::npos);
  auto [code, log] = run({binary(), "run", cfg, "--set", "train.inner_steps=2", "--set", "train.rounds=2",
                          "--set", "train.lr=0.002"},
                         dir + "/b.log", 600);
  CATCH_INFO(log);
  CATCH_CHECK(code == 0);
  CATCH_CHECK(log.find("the checkpoint is " + std::to_string(stopped_at) +
                       " inner steps into round 1, and train.inner_steps = 2 now: that round ends at once") !=
              std::string::npos);
  CATCH_CHECK(log.find("resuming with 2 training settings other than the checkpoint's run had: "
                       "train.inner_steps = 2 (it had 1000), train.lr = 0.002 (it had ") !=
              std::string::npos);
  CATCH_CHECK(log.find("no longer an exact resume") != std::string::npos);
  CATCH_CHECK(log.find("train.rounds = 2 (it had") == std::string::npos);
  CATCH_CHECK(read_trace(dir + "/r/loss_trace.tsv").size() == static_cast<size_t>(stopped_at) + 2);
  // Its end is the checkpoint's steps and one round of 2 (not rounds × H = 4): the progress line and the
  // learning-rate schedule go to it (a probe: "step 50/60" after H was raised).
  const auto end = std::to_string(stopped_at + 2);
  CATCH_CHECK(log.find("the run ends at inner step " + end + " (not train.rounds × train.inner_steps = 4") !=
              std::string::npos);
  CATCH_CHECK(log.find(end + "/" + end + " | loss") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a finished run without its result.json makes its final evaluation on the next run",
                "[process][resume]") {
  // A probe: killed during the final evaluation of a run resumed with more rounds, the rerun said "run
  // complete" and kept the earlier session's result.json and end record, which a sweep took as the point's.
  const auto dir = scratch_dir("final-eval");
  const auto cfg = config_file(dir, "r");
  const std::vector<std::string> rounds3{"--set", "train.rounds=3"};
  auto run_r = [&](const std::string& log) {
    std::vector<std::string> args{binary(), "run", cfg};
    args.insert(args.end(), rounds3.begin(), rounds3.end());
    return run(args, dir + "/" + log, 600);
  };
  auto [code, log] = run_r("a.log");
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  const auto whole = read_text(dir + "/r/result.json");
  auto field = [](const std::string& text, const char* key) {
    const auto doc = parse_json(text);
    CATCH_REQUIRE(doc.HasMember(key));
    return doc[key].GetDouble();
  };
  auto last_end = [&] {
    const auto events = read_text(dir + "/r/metrics.jsonl");
    const auto at = events.rfind("{\"kind\":\"end\"");
    CATCH_REQUIRE(at != std::string::npos);
    return events.substr(at, events.find('\n', at) - at);
  };
  // Complete with its result.json: nothing runs.
  auto [c1, l1] = run_r("b.log");
  CATCH_INFO(l1);
  CATCH_CHECK(c1 == 0);
  CATCH_CHECK(l1.find("final evaluation") == std::string::npos);
  // An earlier session's result.json (round 2), then none: each time the evaluation the run made, exactly.
  write_text(dir + "/r/result.json", "{\"rounds\": 2, \"inner_steps_per_worker\": 10, \"val_loss\": 9.5}\n");
  for (const char* name : {"c.log", "d.log"}) {
    auto [c2, l2] = run_r(name);
    CATCH_INFO(l2);
    CATCH_CHECK(c2 == 0);
    CATCH_CHECK(l2.find("has no result.json of round 3: its final evaluation (2 batches) runs now") !=
                std::string::npos);
    const auto again = read_text(dir + "/r/result.json");
    CATCH_CHECK(field(again, "val_loss") == field(whole, "val_loss"));
    CATCH_CHECK(field(again, "rounds") == 3);
    CATCH_CHECK(field(again, "inner_steps_per_worker") == 15);
    CATCH_CHECK(field(again, "tokens") == field(whole, "tokens"));
    CATCH_CHECK(field(last_end(), "val_loss") == Approx(field(whole, "val_loss")).epsilon(1e-8));
    CATCH_CHECK(field(last_end(), "rounds") == 3);
    fs::remove(dir + "/r/result.json");
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a loss trace that cannot be cut back to the resumed step is not appended to",
                "[process][resume]") {
  // A probe (a full disk): the cut failed, the session appended anyway, and the trace read 19 20 16 17 ...
  const auto dir = scratch_dir("trace-cut");
  const auto cfg = finished_run(dir);
  const auto before = read_trace(dir + "/r/loss_trace.tsv");
  CATCH_REQUIRE(before.size() == 10);
  // The resume goes back to round 1 (step 5), and the trace's rewrite fails: its temporary file is a folder.
  const auto files = checkpoints(dir + "/r/checkpoints");
  fs::remove(files.back());
  fs::remove(dir + "/r/result.json");
  fs::create_directories(dir + "/r/loss_trace.tsv.tmp");
  auto [c2, l2] = run({binary(), "run", cfg, "--set", "train.rounds=2"}, dir + "/b.log", 600);
  CATCH_INFO(l2);
  CATCH_CHECK(c2 == 0);
  CATCH_CHECK(l2.find("not cut back to step 5") != std::string::npos);
  CATCH_CHECK(l2.find("this session does not write it") != std::string::npos);
  CATCH_CHECK(read_trace(dir + "/r/loss_trace.tsv") == before);
  // A damaged trace (a probe: random bytes were kept and appended to without a word): its lines that are not
  // the trace's are dropped and said, the file as it was kept beside it; the resumed steps follow the good
  // ones.
  fs::remove_all(dir + "/r/loss_trace.tsv.tmp");
  fs::remove(checkpoints(dir + "/r/checkpoints").back());
  fs::remove(dir + "/r/result.json");
  const std::string good = read_text(dir + "/r/loss_trace.tsv");
  // Its torn last line (a kill mid-write) is no damage: dropped quietly, not counted.
  const std::string damaged = good.substr(0, good.find('\n') + 1) + "x\ty\tz\n\x01\xfe junk\n2\t0\n" +
                              good.substr(good.find('\n') + 1) + "11\t2";
  write_text(dir + "/r/loss_trace.tsv", damaged);
  auto [c3, l3] = run({binary(), "run", cfg, "--set", "train.rounds=2"}, dir + "/c.log", 600);
  CATCH_INFO(l3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(l3.find("3 of its 13 lines are not step<TAB>round<TAB>loss (the first is line 2): dropped; the "
                      "file as it was is kept as " +
                      dir + "/r/loss_trace.tsv.damaged") != std::string::npos);
  CATCH_CHECK(read_text(dir + "/r/loss_trace.tsv.damaged") == damaged);
  const auto after = read_trace(dir + "/r/loss_trace.tsv");
  CATCH_REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    CATCH_CHECK(after[i].first == before[i].first);
    CATCH_CHECK(std::abs(after[i].second - before[i].second) <= 1e-6);
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a checkpoint.dir moved away from the out_dir's checkpoints is refused, not started over",
                "[process][resume]") {
  // A probe: the run started over, emptied the trace and replaced result.json beside 3 checkpoints.
  const auto dir = scratch_dir("moved-ckpt-dir");
  const auto cfg = finished_run(dir);
  const auto trace = read_trace(dir + "/r/loss_trace.tsv");
  const std::vector<std::string> elsewhere{"--set", "train.rounds=2", "--set",
                                           "checkpoint.dir=\"" + dir + "/elsewhere\""};
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), elsewhere.begin(), elsewhere.end());
    return a;
  };
  auto [c2, l2] = run(args({binary(), "run", cfg}), dir + "/b.log", 600);
  CATCH_INFO(l2);
  CATCH_CHECK(c2 == 2);
  CATCH_CHECK(l2.find("holds no checkpoint, but " + dir + "/r/checkpoints holds 2 of this out_dir's run") !=
              std::string::npos);
  CATCH_CHECK(read_trace(dir + "/r/loss_trace.tsv") == trace);
  auto [c3, l3] = run(args({binary(), "run", cfg, "--fresh"}), dir + "/c.log", 600);
  CATCH_INFO(l3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(checkpoints(dir + "/elsewhere").size() == 2);
  // A new out_dir whose checkpoints go elsewhere gets no empty checkpoints/ of its own (a probe).
  auto [c4, l4] =
      run({binary(), "run", cfg, "--set", "train.rounds=1", "--set", "run.out_dir=\"" + dir + "/s\"", "--set",
           "checkpoint.dir=\"" + dir + "/elsewhere-s\""},
          dir + "/d.log", 600);
  CATCH_INFO(l4);
  CATCH_CHECK(c4 == 0);
  CATCH_CHECK(checkpoints(dir + "/elsewhere-s").size() == 1);
  CATCH_CHECK_FALSE(fs::exists(dir + "/s/checkpoints"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a resume after a round's last step under the same train.inner_steps warns of nothing",
                "[process][resume]") {
  // A probe: with inner_steps = 1 every mid-round stop is a round's last step (its average not yet in), and
  // the resume said the round "ends at once" as if train.inner_steps had been lowered.
  const auto dir = scratch_dir("last-step");
  const auto cfg = config_file(dir, "r");
  const std::vector<std::string> h1{"--set", "train.inner_steps=1", "--set", "train.pace_step_s=0.1"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), h1.begin(), h1.end());
    return args;
  };
  const long stopped_at =
      interrupt_after_3_steps(dir, with({binary(), "run", cfg, "--set", "train.rounds=1000"}));
  auto [code, log] =
      run(with({binary(), "run", cfg, "--set", "train.rounds=" + std::to_string(stopped_at + 1)}),
          dir + "/b.log", 600);
  CATCH_INFO(log);
  CATCH_CHECK(code == 0);
  CATCH_CHECK(log.find("resuming from round") != std::string::npos);
  CATCH_CHECK(log.find("ends at once") == std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a checkpoint write slower than runtime.request_timeout_s is waited for, not counted as failed",
    "[process][resume]") {
  const auto dir = scratch_dir("slow-write");
  const auto cfg = config_file(dir, "r");
  // An earlier run stopped mid-line (a full disk): this run's records begin on a line of their own.
  fs::create_directories(dir + "/r");
  write_text(dir + "/r/metrics.jsonl", "{\"kind\":\"step\",\"ts\":1,\"lo");
  auto c = spawn({binary(), "run", cfg, "--set", "train.rounds=3", "--set", "runtime.request_timeout_s=3"},
                 dir + "/1.log", false, {"LONGWAVE_FAULT_SLOW_CHECKPOINT_S=8"});
  CATCH_CHECK(wait_exit(c, 600) == 0);
  const auto log = read_text(dir + "/1.log");
  CATCH_INFO(log);
  CATCH_CHECK(log.find("LONGWAVE_FAULT_SLOW_CHECKPOINT_S: round 1's write takes 8 s more") !=
              std::string::npos);
  CATCH_CHECK(log.find("not written") == std::string::npos);
  CATCH_CHECK(checkpoints(dir + "/r/checkpoints").size() == 3);
  CATCH_CHECK(read_text(dir + "/r/metrics.jsonl").find("\"lo\n{\"kind\":\"start\"") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a round slower than runtime.round_timeout_s fails naming the setting", "[process][resume]") {
  const auto dir = scratch_dir("round-timeout");
  const auto cfg = config_file(dir, "r");
  fs::create_directories(dir + "/r/loss_trace.tsv");  // in the way: said, not silently dropped
  // 5 paced steps of 0.5 s: a round takes at least 2.5 s, past a 1 s limit however fast the machine.
  auto [code, log] = run({binary(), "run", cfg, "--set", "train.pace_step_s=0.5", "--set",
                          "runtime.round_timeout_s=1", "--set", "train.rounds=2"},
                         dir + "/1.log", 300);
  CATCH_INFO(log);
  CATCH_CHECK(code == 1);
  CATCH_CHECK(log.find("no answer within runtime.round_timeout_s = 1 s") != std::string::npos);
  CATCH_CHECK(log.find("loss_trace.tsv for appending: this run's loss trace is not written") !=
              std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a Ctrl-C or SIGTERM that meets a run already ended keeps the run's exit code",
                "[process][resume]") {
  const auto dir = scratch_dir("late-signal");
  const auto cfg = config_file(dir, "r");
  // The process waits after its run ended: the signal surely meets it then (launch stops every role once
  // one fails: a node that failed as well said 130, or died of the signal).
  const std::vector<std::string> linger{"LONGWAVE_FAULT_SLOW_EXIT_S=600"};
  const auto ended = [&](const std::string& log, int code) {
    return wait_for_text(log, "the process waits 600 s before it exits with code " + std::to_string(code),
                         300);
  };
  // Failed (a paced round past a 1 s limit, however fast the machine): a late Ctrl-C keeps its 1.
  auto a =
      spawn({binary(), "run", cfg, "--set", "train.pace_step_s=0.5", "--set", "runtime.round_timeout_s=1"},
            dir + "/a.log", false, linger);
  CATCH_REQUIRE(ended(dir + "/a.log", 1));
  CATCH_REQUIRE(kill(a.pid, SIGINT) == 0);
  CATCH_CHECK(wait_exit(a, 120) == 1);
  // Done: a late SIGTERM keeps its 0.
  auto b = spawn({binary(), "run", cfg, "--set", "train.rounds=1"}, dir + "/b.log", false, linger);
  CATCH_REQUIRE(ended(dir + "/b.log", 0));
  CATCH_REQUIRE(kill(b.pid, SIGTERM) == 0);
  CATCH_CHECK(wait_exit(b, 120) == 0);
  // Failed before training (no such data.path): the late signal keeps its 2, too.
  auto c = spawn({binary(), "run", cfg, "--set", "data.path=" + dir + "/nowhere.txt"}, dir + "/c.log", false,
                 linger);
  CATCH_REQUIRE(ended(dir + "/c.log", 2));
  CATCH_REQUIRE(kill(c.pid, SIGINT) == 0);
  CATCH_CHECK(wait_exit(c, 120) == 2);
  CATCH_INFO(read_text(dir + "/a.log") + read_text(dir + "/b.log") + read_text(dir + "/c.log"));
  CATCH_CHECK(read_text(dir + "/b.log").find("interrupt") == std::string::npos);
  fs::remove_all(dir);
}

namespace {

/// The "val loss X" of an eval's output line ("" if there is none).
std::string eval_loss(const std::string& log) {
  const auto at = log.find("val loss ");
  return at == std::string::npos ? "" : log.substr(at, log.find(',', at) - at);
}

}  // namespace

CATCH_TEST_CASE(
    "eval reads a run's data directory but never rewrites it: data prepared otherwise there, or a checkpoint "
    "taken to where its run is not, gets a private copy in the cache",
    "[process][eval]") {
  const auto dir = scratch_dir("eval-data");
  const auto cfg = config_file(dir, "r");
  auto [code, log] = run({binary(), "run", cfg, "--set", "train.rounds=2"}, dir + "/1.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  const auto ckpt = checkpoints(dir + "/r/checkpoints").back();
  // The run's corpus stays where it is while eval's cache moves into the test's directory.
  const std::string corpus = default_corpus();
  const std::vector<std::string> env{"XDG_CACHE_HOME=" + dir + "/cache", "LONGWAVE_CORPUS=" + corpus};
  auto eval = [&](const std::string& path, const std::string& name, const std::string& batches = "") {
    std::vector<std::string> args{binary(), "eval", path};
    if (!batches.empty()) args.insert(args.end(), {"--batches", batches});
    auto c = spawn(args, dir + "/" + name + ".log", false, env);
    const int rc = wait_exit(c, 300);
    return std::pair<int, std::string>{rc, read_text(c.log)};
  };
  // The run's own shards: read in place.
  auto [c1, l1] = eval(ckpt, "eval1");
  CATCH_INFO(l1);
  CATCH_REQUIRE(c1 == 0);
  CATCH_CHECK(l1.find("using the run's shards in " + dir + "/r/data") != std::string::npos);
  const auto loss = eval_loss(l1);
  CATCH_REQUIRE_FALSE(loss.empty());
  // The directory now holds another preparation (another val_fraction): eval leaves it as it is.
  auto [c2, l2] =
      run({binary(), "data", "prepare", corpus, "--out", dir + "/r/data", "--val-fraction", "0.2"},
          dir + "/prep.log", 300);
  CATCH_INFO(l2);
  CATCH_REQUIRE(c2 == 0);
  const auto other = read_text(dir + "/r/data/prepared.txt");
  CATCH_REQUIRE(other.find("val_fraction=0.2") != std::string::npos);
  auto [c3, l3] = eval(ckpt, "eval3");
  CATCH_INFO(l3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(l3.find("val_fraction changed") != std::string::npos);
  CATCH_CHECK(l3.find("private copy in " + dir + "/cache/longwave/eval-data/") != std::string::npos);
  CATCH_CHECK(eval_loss(l3) == loss);
  CATCH_CHECK(read_text(dir + "/r/data/prepared.txt") == other);
  // The checkpoint alone, its run's directory gone: nothing is made there, the private copy is used.
  fs::copy_file(ckpt, dir + "/alone.lwc");
  fs::remove_all(dir + "/r");
  // Copies of other corpora, used before: the newest are kept, an older one that a process prepares too.
  const std::string copies = dir + "/cache/longwave/eval-data/";
  for (int i = 0; i < 5; ++i) {
    fs::create_directories(copies + "old-" + std::to_string(i));
    write_text(copies + "old-" + std::to_string(i) + "/.prepare.lock", "");
    fs::last_write_time(copies + "old-" + std::to_string(i),
                        fs::file_time_type::clock::now() - std::chrono::hours(10 - i));
  }
  const int held = ::open((copies + "old-0/.prepare.lock").c_str(), O_RDWR | O_CLOEXEC);
  CATCH_REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);
  auto [c4, l4] = eval(dir + "/alone.lwc", "eval4");
  ::close(held);
  CATCH_INFO(l4);
  CATCH_CHECK(c4 == 0);
  CATCH_CHECK(l4.find("removed 1 older private copy from " + copies.substr(0, copies.size() - 1) +
                      " (old-1); the newest 4 are kept") != std::string::npos);
  CATCH_CHECK(fs::exists(copies + "old-0"));  // being prepared
  CATCH_CHECK_FALSE(fs::exists(copies + "old-1"));
  for (int i = 2; i < 5; ++i) CATCH_CHECK(fs::exists(copies + "old-" + std::to_string(i)));
  CATCH_CHECK(l4.find("using cached shards in " + dir + "/cache/longwave/eval-data/") != std::string::npos);
  CATCH_CHECK(eval_loss(l4) == loss);
  CATCH_CHECK_FALSE(fs::exists(dir + "/r"));
  // The corpus moved (the run's default is gone): --data names where it is now, and the loss is the same.
  fs::copy_file(corpus, dir + "/moved.txt");
  const std::vector<std::string> moved_env{"XDG_CACHE_HOME=" + dir + "/cache",
                                           "LONGWAVE_CORPUS=" + dir + "/gone.txt"};
  auto gone = spawn({binary(), "eval", dir + "/alone.lwc"}, dir + "/eval-gone.log", false, moved_env);
  CATCH_CHECK(wait_exit(gone, 300) == 2);  // the stored data.path (the default corpus) is not there
  auto moved = spawn({binary(), "eval", dir + "/alone.lwc", "--data", dir + "/moved.txt"},
                     dir + "/eval-moved.log", false, moved_env);
  CATCH_CHECK(wait_exit(moved, 300) == 0);
  const auto l7 = read_text(dir + "/eval-moved.log");
  CATCH_INFO(l7);
  CATCH_CHECK(eval_loss(l7) == loss);
  CATCH_CHECK(l7.find("is not the data the checkpoint's run read") == std::string::npos);
  fs::resize_file(dir + "/moved.txt", fs::file_size(dir + "/moved.txt") / 2);
  auto halved = spawn({binary(), "eval", dir + "/alone.lwc", "--data", dir + "/moved.txt"},
                      dir + "/eval-halved.log", false, moved_env);
  CATCH_CHECK(wait_exit(halved, 300) == 0);
  CATCH_CHECK(read_text(dir + "/eval-halved.log").find("is not the data the checkpoint's run read") !=
              std::string::npos);
  // Data that is no text, or too little: refused (exit 2), no private copy is left behind for it, and none of
  // the copies there is evicted for it (by name: the cache is at its limit of 4, so a count would not tell).
  const auto copies_now = [&] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(copies)) names.insert(e.path().filename().string());
    return names;
  };
  const auto copies_before = copies_now();
  std::string noise(4096, '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_text(dir + "/noise.bin", noise);
  write_text(dir + "/notes.txt", "my short notes\n");  // text, but too short for one validation window
  for (const std::string& bad : {dir + "/noise.bin", std::string("/dev/null"), dir + "/notes.txt"}) {
    auto refused =
        spawn({binary(), "eval", dir + "/alone.lwc", "--data", bad}, dir + "/eval-bad.log", false, moved_env);
    CATCH_CHECK(wait_exit(refused, 300) == 2);
    CATCH_INFO(read_text(dir + "/eval-bad.log"));
    CATCH_CHECK(copies_now() == copies_before);
  }
  // Its run's out_dir is a file now: the stored config's paths are where the run was, not checked here.
  write_text(dir + "/r", "not a directory any more\n");
  auto [c6, l6] = eval(dir + "/alone.lwc", "eval6");
  CATCH_INFO(l6);
  CATCH_CHECK(c6 == 0);
  CATCH_CHECK(eval_loss(l6) == loss);
  fs::remove(dir + "/r");
  // More batches than the validation set holds: as many as it holds, said, not its windows over again.
  auto [c5, l5] = eval(dir + "/alone.lwc", "eval5", "1000000000");
  CATCH_INFO(l5);
  CATCH_CHECK(c5 == 0);
  CATCH_CHECK(l5.find("eval: --batches 1000000000 is more than the ") != std::string::npos);
  CATCH_CHECK(l5.find("batches)") != std::string::npos);
  fs::remove_all(dir);
}

namespace {

/// Streaming over the sparse codec with `sparse_sets`, SIGKILLed mid-way: the resume must be exact. In one
/// process each worker is coded as a one-worker node, with an error-feedback residual per worker and
/// fragment: without them in the checkpoint, the rounds after the restart would differ.
void check_sparse_resume(const std::string& name, const std::vector<std::string>& sparse_sets) {
  const auto dir = scratch_dir(name);
  auto sets = streaming_sets;
  sets.insert(sets.end(), sparse_sets.begin(), sparse_sets.end());
  check_interrupted_resume(dir, sets, SIGKILL);
  fs::remove_all(dir);
}

}  // namespace

CATCH_TEST_CASE(
    "with the sparse codec and streaming a run SIGKILLed mid-way resumes exactly, each worker's residual "
    "included",
    "[process][resume][policy][sparse]") {
  check_sparse_resume("sigkill-sparse", {"comm.dtype=sparse", "comm.density=0.05", "comm.value_bits=4"});
}

// The shared mask depends only on run.seed and the ring label, so after the restart the same indices come up.
CATCH_TEST_CASE(
    "with shared sparse indices and streaming a run SIGKILLed mid-way resumes exactly, residuals included",
    "[process][resume][policy][sparse]") {
  check_sparse_resume("sigkill-sparse-shared", {"comm.dtype=sparse", "comm.density=0.05",
                                                "comm.sparse_indices=shared", "comm.ef_decay=0.5"});
}

CATCH_TEST_CASE(
    "a streaming run's checkpoint resumed by another policy says its unsynchronized steps are dropped",
    "[process][resume][policy]") {
  const auto dir = scratch_dir("streaming-to-sync");
  const auto cfg = config_file(dir, "r");
  const std::vector<std::string> streaming{
      "--set", "train.inner_steps=4", "--set", "diloco.outer=\"streaming\"",
      "--set", "diloco.fragments=2",  "--set", "diloco.tau=1"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto [c1, l1] =
      run(with({binary(), "run", cfg, "--set", "train.rounds=2"}, streaming), dir + "/1.log", 300);
  CATCH_INFO(l1);
  CATCH_REQUIRE(c1 == 0);
  const std::string dropped = "hold inner steps of fragments not yet synchronized";
  // Streaming again: nothing is dropped, nothing said.
  auto [c2, l2] =
      run(with({binary(), "run", cfg, "--set", "train.rounds=3"}, streaming), dir + "/2.log", 300);
  CATCH_INFO(l2);
  CATCH_REQUIRE(c2 == 0);
  CATCH_CHECK(l2.find(dropped) == std::string::npos);
  // Sync starts every round from theta_global: it says what it drops.
  auto [c3, l3] = run({binary(), "run", cfg, "--set", "train.rounds=4", "--set", "train.inner_steps=4"},
                      dir + "/3.log", 300);
  CATCH_INFO(l3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(l3.find("the checkpoint is from a diloco.outer = \"streaming\" run: 2 of its 2 workers " +
                      dropped) != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "an eager run's checkpoint resumed by another policy says its workers' own outer states are dropped",
    "[process][resume][policy]") {
  const auto dir = scratch_dir("eager-to-delayed");
  const auto cfg = config_file(dir, "r");
  const std::string dropped = "workers hold their own outer parameters and momentum";
  auto [c1, l1] = run({binary(), "run", cfg, "--set", "train.rounds=2", "--set", "diloco.outer=\"eager\""},
                      dir + "/1.log", 300);
  CATCH_INFO(l1);
  CATCH_REQUIRE(c1 == 0);
  // Eager again: nothing is dropped, nothing said.
  auto [c2, l2] = run({binary(), "run", cfg, "--set", "train.rounds=3", "--set", "diloco.outer=\"eager\""},
                      dir + "/2.log", 300);
  CATCH_INFO(l2);
  CATCH_REQUIRE(c2 == 0);
  CATCH_CHECK(l2.find(dropped) == std::string::npos);
  // Delayed keeps one theta_global (it was dropped without a word).
  auto [c3, l3] = run({binary(), "run", cfg, "--set", "train.rounds=4", "--set", "diloco.outer=\"delayed\""},
                      dir + "/3.log", 300);
  CATCH_INFO(l3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(l3.find("the checkpoint is from a diloco.outer = \"eager\" run: 2 of its " + dropped) !=
              std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("signals that come while an interrupted run ends still end it with exit 130",
                "[process][resume]") {
  const auto dir = scratch_dir("late-signal");
  const auto cfg = config_file(dir, "r");
  auto a = spawn({binary(), "run", cfg, "--set", "train.pace_step_s=0.2"}, dir + "/a.log");
  CATCH_REQUIRE(wait_for_text(dir + "/a.log", "step", 300));
  CATCH_REQUIRE(kill(a.pid, SIGINT) == 0);
  CATCH_REQUIRE(wait_for_text(dir + "/a.log", "stopped at inner step", 120));
  // SIGTERM after SIGTERM until it is gone: one lands after the run's handlers are put back. Killed by the
  // signal (the default action) would be a wait status without an exit code.
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (waitpid(a.pid, &status, WNOHANG) != a.pid) {
    CATCH_REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120));
    kill(a.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CATCH_INFO(read_text(dir + "/a.log"));
  CATCH_CHECK(WIFEXITED(status));
  CATCH_CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) == 130);
  CATCH_CHECK_FALSE(checkpoints(dir + "/r/checkpoints").empty());
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a stop waits for the evaluation in flight and records it", "[process][resume]") {
  const auto dir = scratch_dir("stop-eval");
  const auto cfg = config_file(dir, "r");
  // Every round's evaluation runs beside the training ([eval] async) and outlasts a paced round.
  auto a = spawn({binary(), "run", cfg, "--set", "eval.every_rounds=1", "--set", "eval.async=true", "--set",
                  "eval.batches=400", "--set", "metrics.enabled=true", "--set", "train.pace_step_s=0.05"},
                 dir + "/a.log");
  const auto jsonl = dir + "/r/metrics.jsonl";
  CATCH_REQUIRE(
      wait_until([&] { return read_text(jsonl).find("\"kind\":\"round\"") != std::string::npos; }, 300));
  CATCH_REQUIRE(kill(a.pid, SIGINT) == 0);
  CATCH_CHECK(wait_exit(a, 300) == 130);
  const auto log = read_text(dir + "/a.log");
  CATCH_INFO(log);
  const std::string waits = "stopping: the evaluation of round ";
  if (const auto at = log.find(waits); at == std::string::npos) {
    CATCH_WARN("the evaluation had ended before the stop; the wait was not exercised");
  } else {
    const auto round = std::stol(log.substr(at + waits.size()));
    CATCH_CHECK(log.find(fmt_eval_line(round)) != std::string::npos);
    CATCH_CHECK(std::regex_search(
        read_text(jsonl), std::regex("\"kind\":\"eval\"[^\\n]*\"round\":" + std::to_string(round) + ",")));
  }
  fs::remove_all(dir);
}
