// Nothing lost, nothing silent, with the real binary: checkpoints that cannot be written (a full tmpfs), a
// diverging run, a finished run started again, two runs of one out_dir, stray files in the checkpoint
// directory, and an exact cluster resume with int8 and error feedback.
#include <catch2/catch.hpp>

#include <sys/mount.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include "runtime/checkpoint/checkpoint_store.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

const std::string quick_sections = std::string("\n[model]\nseq_len = 64\n") + mechanics_model + R"(
[train]
workers = 2
inner_steps = 5
rounds = 8
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
)";

std::string quick_config(const std::string& dir, const std::string& name, const std::string& extra = "") {
  const auto path = dir + "/" + name + ".toml";
  write_text(path, "[run]\nout_dir = \"" + dir + "/" + name + "\"\nseed = 5\n" + quick_sections + extra);
  return path;
}

std::vector<std::string> args(std::vector<std::string> a, const std::vector<std::string>& sets) {
  for (const auto& s : sets) a.insert(a.end(), {"--set", s});
  return a;
}

/// The last non-empty line of a text.
std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

/// The number after `prefix` in the first line that has it, or -1.
long number_after(const std::string& text, const std::string& prefix) {
  const auto pos = text.find(prefix);
  return pos == std::string::npos ? -1 : std::stol(text.substr(pos + prefix.size()));
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

/// A tmpfs of `bytes` mounted at `dir` for the test's lifetime (root only; skipped elsewhere).
struct small_tmpfs {
  std::string dir;
  bool mounted = false;
  small_tmpfs(std::string d, size_t bytes) : dir(std::move(d)) {
    fs::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + std::to_string(bytes)).c_str()) == 0;
  }
  ~small_tmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

}  // namespace

namespace {

/// The full-disk case in `dir`; the tmpfs is unmounted when it returns (or a REQUIRE throws).
void check_full_disk(const std::string& dir) {
  const auto cfg = quick_config(dir, "run");
  // One checkpoint of this run: theta, momentum and 2 replicas x (master, exp_avg, exp_avg_sq), fp32.
  auto [dry_code, dry] = run({binary(), "run", cfg, "--dry-run"}, dir + "/dry.log", 60);
  CATCH_REQUIRE(dry_code == 0);
  const long n_params = number_after(dry, "# parameters: ");
  CATCH_REQUIRE(n_params > 0);
  const size_t one_checkpoint = static_cast<size_t>(n_params) * 4 * 8 + 64 * 1024;
  // Room for one checkpoint (round 1) but not for a second beside it.
  small_tmpfs disk(dir + "/disk", one_checkpoint * 3 / 2);
  if (!disk.mounted) {
    std::printf("LONGWAVE_TEST_SKIPPED: cannot mount a tmpfs here (needs root)\n");
    return;
  }

  // Default policy: 2 failed writes in a row stop the run (rounds 2 and 3), naming the round-1 checkpoint.
  auto [code, log] = run(args({binary(), "run", cfg}, {"checkpoint.dir=" + disk.dir}), dir + "/a.log", 300);
  CATCH_INFO(log);
  CATCH_CHECK(code == 3);
  CATCH_CHECK(log.find("stopping after 2 failed checkpoint writes in a row") != std::string::npos);
  CATCH_CHECK(log.find("final:") == std::string::npos);
  CATCH_CHECK(last_line(log).find("the run's state is NOT on disk") != std::string::npos);
  CATCH_CHECK(last_line(log).find("newest checkpoint on disk: round 1, inner step 5") != std::string::npos);
  CATCH_CHECK(runtime::checkpoint_store(disk.dir, 100).list().size() == 1);

  // max_failed_writes = 0 trains to the end, but still does not exit 0: the final state is not on disk.
  auto [code0, log0] =
      run(args({binary(), "run", cfg}, {"checkpoint.dir=" + disk.dir, "checkpoint.max_failed_writes=0"}),
          dir + "/b.log", 300);
  CATCH_INFO(log0);
  CATCH_CHECK(code0 == 3);
  CATCH_CHECK(log0.find("resuming from round 1") != std::string::npos);
  CATCH_CHECK(log0.find("final:") != std::string::npos);
  CATCH_CHECK(last_line(log0).find("training finished, but the checkpoint of round 8 could not be written") !=
              std::string::npos);
  CATCH_CHECK(last_line(log0).find("NOT on disk") != std::string::npos);
}

}  // namespace

CATCH_TEST_CASE("checkpoints that cannot be written end the run with exit code 3 and a last line saying so",
                "[process][checkpoint]") {
  const auto dir = scratch_dir("fulldisk");
  check_full_disk(dir);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a diverging run stops naming the round and writes no non-finite checkpoint",
                "[process][checkpoint]") {
  const auto dir = scratch_dir("diverge");
  for (const std::string mode : {"single", "ddp"}) {
    CATCH_INFO("mode " << mode);
    const auto cfg = quick_config(dir, mode);
    const std::vector<std::string> base = {
        "run.mode=" + mode, "train.workers=" + std::string(mode == "single" ? "1" : "2"), "train.rounds=3"};
    auto [code, log] = run(args({binary(), "run", cfg}, base), dir + "/" + mode + "1.log", 300);
    CATCH_INFO(log);
    CATCH_REQUIRE(code == 0);
    // Then the same run continued with a learning rate and weight decay that blow the weights up.
    auto sets = base;
    sets.back() = "train.rounds=40";
    sets.insert(sets.end(), {"train.lr=10", "train.weight_decay=1", "train.warmup_steps=0"});
    auto [code2, log2] = run(args({binary(), "run", cfg}, sets), dir + "/" + mode + "2.log", 300);
    CATCH_INFO(log2);
    CATCH_CHECK(code2 == 1);
    CATCH_CHECK(log2.find("has NaN or infinite values") != std::string::npos);
    CATCH_CHECK(log2.find("final:") == std::string::npos);
    std::smatch m;
    const std::regex round_re("of round ([0-9]+) has NaN");
    CATCH_REQUIRE(std::regex_search(log2, m, round_re));
    const uint64_t bad_round = std::stoull(m[1]);
    CATCH_CHECK(bad_round > 3);
    // Every checkpoint left loads, is from before the diverged round, and holds finite weights.
    runtime::checkpoint_store store(dir + "/" + mode + "/checkpoints", 100);
    const auto files = store.list();
    CATCH_REQUIRE_FALSE(files.empty());
    for (const auto& f : files) {
      const auto c = runtime::checkpoint_store::load_file(f);
      CATCH_CHECK(c.round < bad_round);
      CATCH_CHECK(all_finite(theta_of(c)));
    }
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a result.json that cannot be written ends a finished run with exit code 1, its checkpoint kept",
    "[process][checkpoint]") {
  const auto dir = scratch_dir("noresult");
  const auto cfg = quick_config(dir, "run");
  fs::create_directories(dir + "/run/result.json/in-the-way");  // a directory where the file goes
  auto [code, log] = run(args({binary(), "run", cfg}, {"train.rounds=2"}), dir + "/1.log", 300);
  CATCH_INFO(log);
  CATCH_CHECK(code == 1);
  CATCH_CHECK(log.find("final:") != std::string::npos);
  CATCH_CHECK(last_line(log).find("training finished and its checkpoint is saved, but result.json could not "
                                  "be written: " +
                                  dir + "/run/result.json") != std::string::npos);
  const auto kept = runtime::checkpoint_store(dir + "/run/checkpoints", 100).list();
  CATCH_CHECK(kept.size() >= 1);
  CATCH_CHECK_FALSE(fs::exists(dir + "/run/result.json.tmp"));
  // Resumed with another model, the run names the mismatch and what --fresh would remove; nothing is.
  auto [code2, log2] =
      run(args({binary(), "run", cfg}, {"train.rounds=3", "model.layers=3"}), dir + "/2.log", 300);
  CATCH_INFO(log2);
  CATCH_CHECK(code2 == 1);
  CATCH_CHECK(log2.find(kept.back() + ": checkpoint was written for model '") != std::string::npos);
  // A file copied in from another run: the older ones can still be resumed from.
  CATCH_CHECK((log2.find("there: if only this file is another run's, move it aside to resume from") !=
               std::string::npos) == (kept.size() > 1));
  CATCH_CHECK(log2.find("(start over with --fresh, which removes every checkpoint in " + dir +
                        "/run/checkpoints, or use another out_dir)") != std::string::npos);
  CATCH_CHECK(runtime::checkpoint_store(dir + "/run/checkpoints", 100).list() == kept);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a loss trace that cannot be written is named once, and the run goes on",
                "[process][checkpoint]") {
  // A probe: a full disk left loss_trace.tsv empty without a word. /dev/full fails every write with ENOSPC.
  const auto dir = scratch_dir("trace-full");
  const auto cfg = quick_config(dir, "run");
  fs::create_directories(dir + "/run");
  fs::create_symlink("/dev/full", dir + "/run/loss_trace.tsv");
  auto [code, log] = run(args({binary(), "run", cfg}, {"train.rounds=2"}), dir + "/1.log", 300);
  CATCH_INFO(log);
  CATCH_CHECK(code == 0);
  const std::string said = "cannot write " + dir + "/run/loss_trace.tsv at inner step 1 (a full disk?)";
  CATCH_CHECK(log.find(said) != std::string::npos);
  CATCH_CHECK(log.find(said, log.find(said) + 1) == std::string::npos);
  CATCH_CHECK(log.find("final:") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a finished run started again trains nothing, and raising train.rounds trains only the rest",
                "[process][checkpoint]") {
  const auto dir = scratch_dir("rerun");
  const auto cfg = quick_config(dir, "run");
  const std::vector<std::string> three = {"train.rounds=3"};
  auto [code, log] = run(args({binary(), "run", cfg}, three), dir + "/1.log", 300);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  CATCH_REQUIRE(read_trace(dir + "/run/loss_trace.tsv").size() == 15);
  const auto before = runtime::checkpoint_store(dir + "/run/checkpoints", 100).list();

  auto [code2, log2] = run(args({binary(), "run", cfg}, three), dir + "/2.log", 300);
  CATCH_INFO(log2);
  CATCH_CHECK(code2 == 0);
  CATCH_CHECK(log2.find("run complete: ") != std::string::npos);
  CATCH_CHECK(log2.find("round 3 of train.rounds = 3") != std::string::npos);
  CATCH_CHECK(log2.find("final:") == std::string::npos);
  CATCH_CHECK(read_trace(dir + "/run/loss_trace.tsv").size() == 15);
  CATCH_CHECK(runtime::checkpoint_store(dir + "/run/checkpoints", 100).list() == before);

  auto [code3, log3] = run(args({binary(), "run", cfg}, {"train.rounds=5"}), dir + "/3.log", 300);
  CATCH_INFO(log3);
  CATCH_CHECK(code3 == 0);
  CATCH_CHECK(log3.find("resuming from round 3, inner step 15") != std::string::npos);
  const auto trace = read_trace(dir + "/run/loss_trace.tsv");
  CATCH_CHECK(trace.size() == 25);
  CATCH_CHECK(trace.back().first == 25);

  // A checkpoint inside round 6 (a run with more rounds stopped there) is past train.rounds = 5 too: the run
  // is complete, and round 6 is not finished.
  runtime::checkpoint_store store(dir + "/run/checkpoints", 100);
  auto mid = runtime::checkpoint_store::load_file(store.list().back());
  CATCH_REQUIRE(mid.round == 5);
  int replicas = 0;
  for (auto& b : mid.blobs) {
    if (b.name.find("/counters") == std::string::npos) continue;
    CATCH_REQUIRE(b.storage.size() == 3 * sizeof(int64_t));
    const int64_t steps_in_round = 2;
    std::memcpy(b.storage.data() + 2 * sizeof(int64_t), &steps_in_round, sizeof steps_in_round);
    b.data = b.storage.data();
    ++replicas;
  }
  CATCH_REQUIRE(replicas > 0);
  mid.step += 2;
  store.write(mid);
  const auto with_mid = store.list();
  auto [code4, log4] = run(args({binary(), "run", cfg}, {"train.rounds=5"}), dir + "/4.log", 300);
  CATCH_INFO(log4);
  CATCH_CHECK(code4 == 0);
  CATCH_CHECK(log4.find("round 5 of train.rounds = 5 (inner step 27, 2 steps into round 6, which is past the "
                        "end); nothing to train") != std::string::npos);
  CATCH_CHECK(read_trace(dir + "/run/loss_trace.tsv").size() == 25);
  CATCH_CHECK(runtime::checkpoint_store(dir + "/run/checkpoints", 100).list() == with_mid);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a second run of the same out_dir is refused with the holder's PID, and a dead holder frees it",
    "[process][checkpoint]") {
  const auto dir = scratch_dir("lock");
  const auto cfg = quick_config(dir, "run");
  const std::vector<std::string> long_run = {"train.rounds=1000000"};  // the test ends it
  auto first = spawn(args({binary(), "run", cfg}, long_run), dir + "/first.log");
  CATCH_REQUIRE(wait_until([&] { return read_trace(dir + "/run/loss_trace.tsv").size() >= 3; }, 120));
  auto [code, log] = run(args({binary(), "run", cfg}, long_run), dir + "/second.log", 60);
  CATCH_INFO(log);
  CATCH_CHECK(code == 4);
  CATCH_CHECK(log.find("is in use by another longwave run (pid " + std::to_string(first.pid) + ")") !=
              std::string::npos);
  // Another out_dir with the first run's checkpoint directory is refused too: it would resume from, rotate
  // away and overwrite the first run's checkpoints.
  auto [code_ck, log_ck] =
      run(args({binary(), "run", cfg}, {"train.rounds=1000000", "run.out_dir=" + dir + "/other",
                                        "checkpoint.dir=" + dir + "/run/checkpoints"}),
          dir + "/shared.log", 60);
  CATCH_INFO(log_ck);
  CATCH_CHECK(code_ck == 4);
  CATCH_CHECK(log_ck.find("checkpoint.dir " + dir +
                          "/run/checkpoints is in use by another longwave run (pid " +
                          std::to_string(first.pid) + ")") != std::string::npos);
  // The first run is untouched: it goes on writing its trace alone.
  const auto n = read_trace(dir + "/run/loss_trace.tsv").size();
  CATCH_CHECK(wait_until([&] { return read_trace(dir + "/run/loss_trace.tsv").size() > n + 2; }, 60));
  // SIGKILL releases the lock with the process: the next run of the out_dir goes ahead.
  kill(first.pid, SIGKILL);
  CATCH_CHECK(wait_exit(first, 30) == 128 + SIGKILL);
  auto [code3, log3] = run(args({binary(), "run", cfg}, {"train.rounds=1"}), dir + "/third.log", 120);
  CATCH_INFO(log3);
  CATCH_CHECK(code3 == 0);
  CATCH_CHECK(log3.find("in use by another") == std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("stray files in the checkpoint directory are named, unfinished writes removed, never counted",
                "[process][checkpoint]") {
  const auto dir = scratch_dir("strays");
  const auto cfg = quick_config(dir, "run");
  const auto ckpt = dir + "/run/checkpoints";
  fs::create_directories(ckpt);
  write_text(ckpt + "/ckpt-00000002-0000000010.lwc.tmp", "half a checkpoint");
  write_text(ckpt + "/notes.txt", "mine");
  auto [code, log] = run(args({binary(), "run", cfg}, {"train.rounds=2"}), dir + "/1.log", 300);
  CATCH_INFO(log);
  CATCH_CHECK(code == 0);
  CATCH_CHECK(
      log.find("removed " + ckpt + "/ckpt-00000002-0000000010.lwc.tmp: an unfinished checkpoint write") !=
      std::string::npos);
  CATCH_CHECK(log.find("ignoring " + ckpt + "/notes.txt: not a checkpoint file") != std::string::npos);
  CATCH_CHECK(log.find("no checkpoint to resume from in " + ckpt + ": starting a fresh run") !=
              std::string::npos);
  CATCH_CHECK_FALSE(fs::exists(ckpt + "/ckpt-00000002-0000000010.lwc.tmp"));
  CATCH_CHECK(fs::exists(ckpt + "/notes.txt"));

  // A garbage file named like a newer checkpoint: reported at start and moved to corrupt/, where it is kept
  // and neither counted towards keep = 3 nor read again.
  const auto garbage = ckpt + "/ckpt-00009999-0000099999.lwc";
  write_text(garbage, std::string(4096, 'x'));
  auto [code2, log2] = run(args({binary(), "run", cfg}, {"train.rounds=6"}), dir + "/2.log", 300);
  CATCH_INFO(log2);
  CATCH_CHECK(code2 == 0);
  CATCH_CHECK(log2.find("checkpoint ckpt-00009999-0000099999.lwc is corrupt (bad magic") !=
              std::string::npos);
  CATCH_CHECK(log2.find("moved ckpt-00009999-0000099999.lwc to " + ckpt +
                        "/corrupt/ckpt-00009999-0000099999.lwc") != std::string::npos);
  CATCH_CHECK(log2.find("resuming from round 2") != std::string::npos);
  CATCH_CHECK(runtime::checkpoint_store(ckpt, 100).list().size() == 3);
  CATCH_CHECK_FALSE(fs::exists(garbage));
  CATCH_CHECK(fs::file_size(ckpt + "/corrupt/ckpt-00009999-0000099999.lwc") == 4096);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a cluster on int8 with error feedback, SIGKILLed and resumed, ends exactly as an uninterrupted one",
    "[process][cluster][resume]") {
  const auto dir = scratch_dir("ef_resume");
  auto run_cluster = [&](const std::string& name, bool interrupt) {
    const auto sub = dir + "/" + name;
    fs::create_directories(sub);
    cluster_ports ports;
    const auto file = cluster_file(
        sub, {1, 1}, ports, "[metrics]\nenabled = false\n[comm]\ndtype = \"int8\"\nerror_feedback = true\n");
    edit_file(file, "rounds = 3", "rounds = 10");
    if (interrupt) {
      // Paced (0.5 s a step: outside the fingerprint, the numbers are the same), so that the kill after the
      // third round lands seconds before the tenth, however loaded the machine.
      auto coord = spawn({binary(), "coordinator", file}, sub + "/coord1.log");
      auto n0 = spawn({binary(), "node", file, "--node", "n0", "--set", "train.pace_step_s=0.5"},
                      sub + "/n0_1.log");
      auto n1 = spawn({binary(), "node", file, "--node", "n1", "--set", "train.pace_step_s=0.5"},
                      sub + "/n1_1.log");
      const bool trained = wait_until(
          [&] {
            return runtime::checkpoint_store(sub + "/cluster/n0/checkpoints", 100).list().size() >= 3 &&
                   runtime::checkpoint_store(sub + "/cluster/n1/checkpoints", 100).list().size() >= 3;
          },
          300);
      CATCH_REQUIRE(trained);
      for (auto* c : {&n0, &n1, &coord}) kill(c->pid, SIGKILL);
      for (auto* c : {&n0, &n1, &coord}) wait_exit(*c, 30);
      CATCH_REQUIRE(read_trace(sub + "/cluster/n0/loss_trace.tsv").size() < 30);
    }
    auto [code, log] = run({binary(), "launch", file}, sub + "/launch.log", 600);
    CATCH_INFO(log.substr(log.size() > 20000 ? log.size() - 20000 : 0));
    CATCH_REQUIRE(code == 0);
    if (interrupt) {
      CATCH_CHECK(contains(log, "resuming from round"));
      // The finished cluster started once more: every node says so and nothing trains.
      auto [again, log2] = run({binary(), "launch", file}, sub + "/launch2.log", 120);
      CATCH_INFO(log2);
      CATCH_CHECK(again == 0);
      CATCH_CHECK(contains(log2, "launch: exit codes: coordinator=0 n0=0 n1=0"));
      for (const char* node : {"n0", "n1"}) {
        CATCH_CHECK(read_trace(sub + "/cluster/" + node + "/loss_trace.tsv").size() == 30);
      }
      size_t complete = 0;
      for (auto p = log2.find("run complete: "); p != std::string::npos;
           p = log2.find("run complete: ", p + 1))
        ++complete;
      CATCH_CHECK(complete == 2);
    }
    return sub + "/cluster";
  };
  const auto a = run_cluster("a", false);
  const auto b = run_cluster("b", true);
  for (const char* node : {"n0", "n1"}) {
    CATCH_INFO("node " << node);
    const auto ta = read_trace(a + "/" + node + "/loss_trace.tsv"),
               tb = read_trace(b + "/" + node + "/loss_trace.tsv");
    CATCH_REQUIRE(ta.size() == 30);
    CATCH_REQUIRE(tb.size() == ta.size());
    double worst = 0;
    for (size_t i = 0; i < ta.size(); ++i) worst = std::max(worst, std::abs(ta[i].second - tb[i].second));
    CATCH_CHECK(worst <= 1e-6);
    CATCH_CHECK(max_abs_diff(newest_theta(a + "/" + node + "/checkpoints"),
                             newest_theta(b + "/" + node + "/checkpoints")) == 0.0);
  }
  fs::remove_all(dir);
}
