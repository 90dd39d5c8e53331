// `longwave sweep` with the real binary: a 2x2 grid of tiny runs (results, page, a second invocation that
// reruns nothing), points packed two at a time, a fit over model sizes, Ctrl-C and resume against an
// uninterrupted sweep, a failing point, and bad sweep files.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <sched.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

/// A tiny, quick run: 2 workers of one thread each, 8 inner steps of short sequences.
const char* base_config = R"(
[run]
seed = 5
[model]
seq_len = 32
[train]
workers = 2
inner_steps = 2
rounds = 4
batch_size = 4
warmup_steps = 2
threads = 1
[eval]
every_rounds = 2
batches = 2
[checkpoint]
every_rounds = 1
keep = 2
[metrics]
enabled = false
)";

/// DIR/base.toml and DIR/NAME.toml, a sweep of `body` writing to DIR/OUT.
std::string sweep_file(const std::string& dir, const std::string& name, const std::string& out,
                       const std::string& body, const std::string& extra_sweep = "") {
  write_text(dir + "/base.toml", base_config);
  const auto path = dir + "/" + name + ".toml";
  write_text(path,
             "[sweep]\nbase = \"base.toml\"\nout_dir = \"" + dir + "/" + out + "\"\n" + extra_sweep + body);
  return path;
}

/// results.csv as rows of column -> value.
std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::istringstream in(read_text(path));
  std::string line;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  auto split = [](const std::string& l) {
    std::vector<std::string> out(1);
    for (const char c : l) {
      if (c == ',')
        out.emplace_back();
      else
        out.back().push_back(c);
    }
    return out;
  };
  if (std::getline(in, line)) header = split(line);
  while (std::getline(in, line)) {
    const auto cells = split(line);
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

double number(const std::string& s) {
  return s.empty() ? NAN : std::stod(s);
}

/// Holds a run folder's lock as a live run does (this test process's pid in it); close the fd to free it.
int hold_folder(const std::string& folder) {
  const int fd = open((folder + "/.longwave.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CATCH_REQUIRE(fd >= 0);
  CATCH_REQUIRE(flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::string pid = std::to_string(getpid()) + "\n";
  CATCH_REQUIRE(pwrite(fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size()));
  return fd;
}

}  // namespace

CATCH_TEST_CASE("a sweep runs every point, writes results and a page, and a second run reruns nothing",
                "[process][sweep]") {
  const auto dir = scratch_dir("sweep-grid");
  const auto file = sweep_file(dir, "grid", "out", R"(
[grid]
"train.inner_steps" = [2, 4]
"train.lr" = [1e-3, 3e-3]
)",
                               "parallel = \"auto\"\n");
  auto [code, out] = run({binary(), "sweep", file}, dir + "/first.log", 600);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(out.find("4 points (0 done earlier, 4 to run)") != std::string::npos);
  CATCH_CHECK(out.find("parallel = auto") != std::string::npos);
  CATCH_CHECK(occurrences(out, " started; log: ") == 4);
  CATCH_CHECK(out.find("point 4/4 (train.inner_steps=4 train.lr=0.003)") != std::string::npos);
  CATCH_CHECK(out.find("4/4 done") != std::string::npos);
  const auto rows = read_csv(dir + "/out/results.csv");
  CATCH_REQUIRE(rows.size() == 4);
  std::set<std::string> ids;
  for (const auto& r : rows) {
    CATCH_INFO(r.at("id"));
    ids.insert(r.at("id"));
    CATCH_CHECK(r.at("status") == "done");
    CATCH_CHECK(r.at("exit_code") == "0");
    CATCH_CHECK(std::isfinite(number(r.at("val_loss"))));
    CATCH_CHECK(number(r.at("val_ppl")) == Approx(std::exp(number(r.at("val_loss")))).epsilon(1e-6));
    CATCH_CHECK(number(r.at("tokens")) > 0);
    CATCH_CHECK(number(r.at("wall_s")) > 0);
    CATCH_CHECK(number(r.at("params")) > 1e6);
    CATCH_CHECK(number(r.at("steps")) == 4 * number(r.at("train.inner_steps")));
    CATCH_CHECK(fs::exists(r.at("log")));
  }
  CATCH_CHECK(ids.size() == 4);
  CATCH_CHECK(rows[0].at("train.inner_steps") == "2");
  CATCH_CHECK(rows[3].at("train.lr") == "0.003");
  CATCH_CHECK(occurrences(read_text(dir + "/out/results.jsonl"), "\"status\":\"done\"") == 4);
  const auto page = read_text(dir + "/out/sweep.html");
  CATCH_CHECK(page.find("Final val loss against train.inner_steps") != std::string::npos);
  CATCH_CHECK(page.find("Final val loss against train.lr") != std::string::npos);
  CATCH_CHECK(page.find("Val loss per point") != std::string::npos);
  CATCH_CHECK(page.find("train.inner_steps (rows) by train.lr (columns)") != std::string::npos);
  CATCH_CHECK(occurrences(page, "<svg") >= 5);
  CATCH_CHECK(page.find("http") == std::string::npos);  // self-contained

  // Again: every point is skipped, and no point's run starts again.
  auto [code2, out2] = run({binary(), "sweep", file}, dir + "/second.log", 300);
  CATCH_INFO(out2);
  CATCH_CHECK(code2 == 0);
  CATCH_CHECK(out2.find("4 points (4 done earlier, 0 to run)") != std::string::npos);
  CATCH_CHECK(out2.find("started") == std::string::npos);
  for (const auto& r : rows) CATCH_CHECK(occurrences(read_text(r.at("log")), "=== longwave sweep") == 1);
  CATCH_CHECK(read_csv(dir + "/out/results.csv") == rows);

  auto [code3, out3] = run({binary(), "sweep", file, "--results-only"}, dir + "/third.log", 300);
  CATCH_INFO(out3);
  CATCH_CHECK(code3 == 0);
  CATCH_CHECK(out3.find("(4 of 4 points done)") != std::string::npos);
  CATCH_CHECK(read_csv(dir + "/out/results.csv") == rows);
  // A done point whose metrics.jsonl is gone keeps result.json's final figures, and says so; a point.json
  // that is a FIFO reads as no record instead of blocking the sweep (a probe: both were silent, the FIFO
  // hung).
  {
    const auto one = fs::path(rows[0].at("log")).parent_path(),
               two = fs::path(rows[1].at("log")).parent_path();
    fs::rename(one / "metrics.jsonl", one / "metrics.jsonl.kept");
    fs::rename(two / "point.json", two / "point.json.kept");
    CATCH_REQUIRE(::mkfifo((two / "point.json").c_str(), 0600) == 0);
    auto [code_m, out_m] = run({binary(), "sweep", file, "--results-only"}, dir + "/unread.log", 300);
    CATCH_INFO(out_m);
    CATCH_CHECK(code_m == 0);
    CATCH_CHECK(out_m.find("warning: point 1/4 (") != std::string::npos);
    CATCH_CHECK(out_m.find("metrics.jsonl is missing: its final figures are result.json's, without curves") !=
                std::string::npos);
    const auto unread = read_csv(dir + "/out/results.csv");
    CATCH_REQUIRE(unread.size() == 4);
    CATCH_CHECK(unread[0].at("status") == "done");
    CATCH_CHECK(number(unread[0].at("val_loss")) == Approx(number(rows[0].at("val_loss"))).epsilon(1e-6));
    CATCH_CHECK(unread[1].at("status") == "pending");
    fs::remove(two / "point.json");
    fs::rename(two / "point.json.kept", two / "point.json");
    fs::rename(one / "metrics.jsonl.kept", one / "metrics.jsonl");
  }

  // A [sweep] set that gives every point the config it had (eval.batches is 2 in the base), or changes only
  // how often it saves and logs and how many checkpoints it keeps: nothing reruns.
  (void)sweep_file(dir, "grid", "out",
                   "[grid]\n\"train.inner_steps\" = [2, 4]\n\"train.lr\" = [1e-3, 3e-3]\n",
                   "parallel = \"auto\"\nset = [\"eval.batches = 2\", \"checkpoint.keep = 1\", "
                   "\"checkpoint.every_rounds = 2\", \"runtime.log_every_steps = 3\"]\n");
  auto [code5, out5] = run({binary(), "sweep", file}, dir + "/same.log", 300);
  CATCH_INFO(out5);
  CATCH_CHECK(code5 == 0);
  CATCH_CHECK(out5.find("4 points (4 done earlier, 0 to run)") != std::string::npos);
  CATCH_CHECK(out5.find("started") == std::string::npos);
  // The same out_dir written another way (through a link): the same points (they all started over).
  fs::create_directory_symlink(dir, dir + "/link");
  const auto linked = sweep_file(dir, "linked", "link/out",
                                 "[grid]\n\"train.inner_steps\" = [2, 4]\n\"train.lr\" = [1e-3, 3e-3]\n",
                                 "parallel = \"auto\"\n");
  auto [code6, out6] = run({binary(), "sweep", linked}, dir + "/linked.log", 300);
  CATCH_INFO(out6);
  CATCH_CHECK(code6 == 0);
  CATCH_CHECK(out6.find("4 points (4 done earlier, 0 to run)") != std::string::npos);

  // The base config changes: every point's record is stale, so each starts over (not "run complete" from
  // the old checkpoints) and its numbers are the new run's.
  auto base = read_text(dir + "/base.toml");
  base.replace(base.find("warmup_steps = 2"), 16, "warmup_steps = 3");
  write_text(dir + "/base.toml", base);
  // Before they rerun, the table has no numbers for them: those of the runs there are of other settings (a
  // probe: "stale,-1,3.2531,...").
  auto [code_s, out_s] = run({binary(), "sweep", file, "--results-only"}, dir + "/stale.log", 300);
  CATCH_INFO(out_s);
  CATCH_CHECK(code_s == 0);
  for (const auto& row : read_csv(dir + "/out/results.csv")) {
    CATCH_CHECK(row.at("status") == "stale");
    CATCH_CHECK(row.at("exit_code").empty());
    CATCH_CHECK(row.at("val_loss").empty());
  }
  auto [code4, out4] = run({binary(), "sweep", file}, dir + "/fourth.log", 600);
  CATCH_INFO(out4);
  CATCH_CHECK(code4 == 0);
  CATCH_CHECK(out4.find("4 points (0 done earlier, 4 to run)") != std::string::npos);
  const auto rows4 = read_csv(dir + "/out/results.csv");
  CATCH_REQUIRE(rows4.size() == 4);
  for (size_t i = 0; i < rows4.size(); ++i) {
    CATCH_INFO(rows4[i].at("id"));
    CATCH_CHECK(rows4[i].at("status") == "done");
    CATCH_CHECK(read_text(rows4[i].at("log")).find("run complete") == std::string::npos);
    CATCH_CHECK(number(rows4[i].at("val_loss")) != number(rows[i].at("val_loss")));
  }
  // Their first runs were moved aside, not replaced; the base config back as it was, each takes its run
  // back and nothing trains.
  CATCH_CHECK(occurrences(out4, "moved to " + dir + "/out/superseded/") == 4);
  base.replace(base.find("warmup_steps = 3"), 16, "warmup_steps = 2");
  write_text(dir + "/base.toml", base);
  auto [code7, out7] = run({binary(), "sweep", file}, dir + "/back.log", 300);
  CATCH_INFO(out7);
  CATCH_CHECK(code7 == 0);
  CATCH_CHECK(out7.find("4 points (4 done earlier, 0 to run)") != std::string::npos);
  CATCH_CHECK(occurrences(out7, "takes back the run of the same settings in " + dir + "/out/superseded/") ==
              4);
  CATCH_CHECK(out7.find("started") == std::string::npos);
  CATCH_CHECK(read_csv(dir + "/out/results.csv") == rows);
  // Two seeds where there was one: every id gains its seed, and the first seed's points are found.
  (void)sweep_file(dir, "grid", "out",
                   "[grid]\n\"train.inner_steps\" = [2, 4]\n\"train.lr\" = [1e-3, 3e-3]\n",
                   "parallel = \"auto\"\nrepeats = 2\n");
  auto [code8, out8] = run({binary(), "sweep", file, "--dry-run"}, dir + "/seeds.log", 300);
  CATCH_INFO(out8);
  CATCH_CHECK(code8 == 0);
  CATCH_CHECK(out8.find("8 points (0 done earlier, 8 to run)") != std::string::npos);
  CATCH_CHECK(out8.find("4 of them take back a run of the same settings found under another id") !=
              std::string::npos);

  // --fresh, interrupted once its first point started: every earlier run was moved aside at once (kept), so
  // the table and the next invocation agree (a finished point not yet rerun read "pending" in the table, and
  // the next plain sweep took it as done again).
  (void)sweep_file(dir, "grid", "out",
                   "[grid]\n\"train.inner_steps\" = [2, 4]\n\"train.lr\" = [1e-3, 3e-3]\n",
                   "parallel = \"auto\"\n");  // one seed again: its 4 points are done
  auto [fdry_code, fdry] =
      run({binary(), "sweep", file, "--fresh", "--dry-run"}, dir + "/fresh-dry.log", 300);
  CATCH_INFO(fdry);
  CATCH_CHECK(fdry_code == 0);
  CATCH_CHECK(fdry.find("--fresh: 4 earlier runs would move to " + dir + "/out/superseded/fresh-") !=
              std::string::npos);
  auto fresh = spawn({binary(), "sweep", file, "--fresh", "--parallel", "1"}, dir + "/fresh.log");
  CATCH_REQUIRE(wait_for_text(dir + "/fresh.log", " started; log: ", 300));
  kill(fresh.pid, SIGINT);
  CATCH_CHECK(wait_exit(fresh, 300) == 130);
  const auto fresh_out = read_text(dir + "/fresh.log");
  CATCH_INFO(fresh_out);
  CATCH_CHECK(fresh_out.find("--fresh: moved the 4 earlier runs to " + dir + "/out/superseded/fresh-") !=
              std::string::npos);
  CATCH_CHECK(
      fresh_out.find("run the same command without --fresh (which starts every point over) to resume") !=
      std::string::npos);
  size_t kept = 0;
  for (const auto& set : fs::directory_iterator(dir + "/out/superseded"))
    for (const auto& run_dir : fs::directory_iterator(set.path()))
      kept += fs::exists(run_dir.path() / "point.json") ? 1 : 0;
  CATCH_CHECK(kept == 4);
  const auto after = read_csv(dir + "/out/results.csv");
  const auto done_rows =
      std::count_if(after.begin(), after.end(), [](auto& r) { return r.at("status") == "done"; });
  auto [code_dry, out_dry] = run({binary(), "sweep", file, "--dry-run"}, dir + "/after-fresh.log", 300);
  CATCH_INFO(out_dry);
  CATCH_CHECK(out_dry.find("4 points (" + std::to_string(done_rows) + " done earlier") != std::string::npos);
  CATCH_CHECK(out_dry.find("take back") == std::string::npos);  // --fresh's discarded runs stay discarded
  // The plan says what superseded/ keeps (it is never pruned), the 4 moved aside among it.
  const std::string keeps = dir + "/out/superseded/ keeps ";
  const auto at = out_dry.find(keeps);
  CATCH_REQUIRE(at != std::string::npos);
  CATCH_CHECK(std::stoul(out_dry.substr(at + keeps.size())) >= kept);
  CATCH_CHECK(out_dry.find("MiB), which no sweep removes", at) != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a sweep with parallel = auto runs one-worker points two at a time, one thread each, over seeds",
    "[process][sweep]") {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2) {
    std::cout << "LONGWAVE_TEST_SKIPPED: needs 2 cores to run two points at once\n";
    return;
  }
  const auto dir = scratch_dir("sweep-pack");
  const auto file = sweep_file(dir, "pack", "out", "[grid]\n\"train.lr\" = [1e-3, 3e-3]\n",
                               "repeats = 2\nset = [\"train.workers=1\", \"train.threads=0\"]\n");
  auto [code, out] = run({binary(), "sweep", file}, dir + "/pack.log", 600);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(out.find("each point needs 1 thread") != std::string::npos);
  CATCH_CHECK(out.find("parallel = auto runs up to 2 points at once") != std::string::npos);
  // The second point starts before the first ends.
  CATCH_CHECK(out.find("point 2/4 (train.lr=0.003 seed=5) started") <
              out.find("point 1/4 (train.lr=0.001 seed=5) done"));
  const auto rows = read_csv(dir + "/out/results.csv");
  CATCH_REQUIRE(rows.size() == 4);
  CATCH_CHECK(rows[2].at("seed") == "6");
  CATCH_CHECK(rows[2].at("id") == "lr=0.001_s6");
  for (const auto& r : rows) {
    CATCH_CHECK(r.at("status") == "done");
    CATCH_CHECK(read_text(r.at("log")).find("--set train.threads=1") != std::string::npos);
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a sweep over model sizes prints the fitted scaling law and writes it to fit.json",
                "[process][sweep]") {
  const auto dir = scratch_dir("sweep-fit");
  const auto file = sweep_file(dir, "fit", "out", "[grid]\n\"model.dim\" = [48, 96, 192]\n[fit]\n");
  auto [code, out] = run({binary(), "sweep", file}, dir + "/fit.log", 600);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(out.find("fit: L(N) = A·N^-alpha + E, A=") != std::string::npos);
  CATCH_CHECK(out.find("(rms residual ") != std::string::npos);
  CATCH_CHECK(out.find("3 points, 3 distinct sizes)") != std::string::npos);
  // Two evaluations per run: each L(D) is refused with a line saying why.
  CATCH_CHECK(occurrences(out, "L(D) = A·D^-alpha + E: not fitted: 2 distinct token counts") == 3);
  const auto json = read_text(dir + "/out/fit.json");
  CATCH_CHECK(json.find("\"alpha\":") != std::string::npos);
  CATCH_CHECK(json.find("\"ok\":true") != std::string::npos);
  CATCH_CHECK(read_text(dir + "/out/sweep.html").find("Scaling fits") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "Ctrl-C or a hangup on a sweep stops its running point, and the same command resumes it to the same "
    "result",
    "[process][sweep]") {
  const auto dir = scratch_dir("sweep-resume");
  const std::string body = "[grid]\n\"train.lr\" = [1e-3, 3e-3]\n";
  const std::string settings = "parallel = 1\nset = [\"train.rounds=10\"]\n";
  // Uninterrupted reference.
  auto [code_a, out_a] =
      run({binary(), "sweep", sweep_file(dir, "a", "a", body, settings)}, dir + "/a.log", 600);
  CATCH_INFO(out_a);
  CATCH_REQUIRE(code_a == 0);

  const auto file = sweep_file(dir, "b", "b", body, settings);
  auto c = spawn({binary(), "sweep", file}, dir + "/b1.log");
  // Only the first point's folder exists while it runs (parallel = 1).
  const auto first_dir = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir + "/b/points", ec)) return e.path().string();
    return std::string();
  };
  // Interrupt once the first point has trained 6 of its 20 steps.
  CATCH_REQUIRE(wait_until(
      [&] { return !first_dir().empty() && read_trace(first_dir() + "/loss_trace.tsv").size() >= 6; }, 300));
  const auto interrupted_dir = first_dir();
  // The point is stopped (SIGSTOP, as Ctrl-Z would) when the sweep is told to stop: the sweep says whom it
  // waits for and that it is stopped (it said nothing, or gave an ETA), and the point stops once continued.
  const auto points = children_of(c.pid);
  CATCH_REQUIRE(points.size() == 1);
  CATCH_REQUIRE(kill(points[0].first, SIGSTOP) == 0);
  // As a closed terminal sends it: SIGHUP, often twice. A stop like Ctrl-C's, never a kill (it was exit 129
  // with results.csv left saying "running").
  CATCH_REQUIRE(kill(c.pid, SIGHUP) == 0);
  CATCH_REQUIRE(kill(c.pid, SIGHUP) == 0);
  const bool waits =
      wait_for_text(dir + "/b1.log", "sweep: stopping: waiting for a point to save its checkpoint", 120);
  kill(points[0].first, SIGCONT);
  CATCH_CHECK(wait_exit(c, 120) == 130);
  const auto out_b1 = read_text(dir + "/b1.log");
  CATCH_INFO(out_b1);
  CATCH_CHECK(waits);
  CATCH_CHECK(out_b1.find("STOPPED by a signal: no progress until `kill -CONT " +
                          std::to_string(points[0].first) + "`") != std::string::npos);
  CATCH_CHECK(out_b1.find("run the same command again to resume") != std::string::npos);
  CATCH_CHECK(out_b1.find("stopped (exit 130)") != std::string::npos);
  CATCH_CHECK(out_b1.find("point 2/2") == std::string::npos);  // the second point never started
  const auto rows_b1 = read_csv(dir + "/b/results.csv");
  CATCH_REQUIRE(rows_b1.size() == 2);
  CATCH_CHECK(rows_b1[0].at("status") == "interrupted");
  CATCH_CHECK(rows_b1[1].at("status") == "pending");

  auto [code_b, out_b] = run({binary(), "sweep", file}, dir + "/b2.log", 600);
  CATCH_INFO(out_b);
  CATCH_REQUIRE(code_b == 0);
  CATCH_CHECK(out_b.find("2 points (0 done earlier, 2 to run)") != std::string::npos);
  CATCH_CHECK(read_text(interrupted_dir + "/log.txt").find("resuming from round") != std::string::npos);
  const auto rows_a = read_csv(dir + "/a/results.csv"), rows_b = read_csv(dir + "/b/results.csv");
  CATCH_REQUIRE(rows_b.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CATCH_CHECK(rows_b[i].at("status") == "done");
    CATCH_CHECK(rows_b[i].at("id") == rows_a[i].at("id"));
    CATCH_CHECK(rows_b[i].at("tokens") == rows_a[i].at("tokens"));
    CATCH_CHECK(std::abs(number(rows_b[i].at("val_loss")) - number(rows_a[i].at("val_loss"))) <= 1e-6);
  }

  // Two interrupts at once (a terminal's Ctrl-C twice, `timeout` passing one on): the running point is
  // killed, no other starts, and the sweep says it was interrupted.
  auto twice = spawn({binary(), "sweep", sweep_file(dir, "c", "c", body, settings)}, dir + "/c.log");
  CATCH_REQUIRE(wait_until(
      [&] {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir + "/c/points", ec))
          if (read_trace(e.path().string() + "/loss_trace.tsv").size() >= 2) return true;
        return false;
      },
      300));
  // Both pending at once: the sweep stopped, given SIGINT and SIGTERM (two kinds, so neither is merged into
  // the other), then continued, handles both before it looks at them.
  CATCH_REQUIRE(kill(twice.pid, SIGSTOP) == 0);
  CATCH_REQUIRE(kill(twice.pid, SIGINT) == 0);
  CATCH_REQUIRE(kill(twice.pid, SIGTERM) == 0);
  CATCH_REQUIRE(kill(twice.pid, SIGCONT) == 0);
  CATCH_CHECK(wait_exit(twice, 120) == 130);
  const auto out_c = read_text(dir + "/c.log");
  CATCH_INFO(out_c);
  CATCH_CHECK(out_c.find("point 2/2") == std::string::npos);
  const auto rows_c = read_csv(dir + "/c/results.csv");
  CATCH_REQUIRE(rows_c.size() == 2);
  CATCH_CHECK(rows_c[0].at("status") == "interrupted");
  CATCH_CHECK(rows_c[1].at("status") == "pending");
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a run that held a point's folder as the sweep began and ended before the point's turn moves aside",
    "[process][sweep]") {
  // A probe: the folder was left alone while in use, then the point started with --fresh, which deleted
  // that run (its checkpoints, metrics.jsonl and result) instead of moving it to superseded/.
  const auto dir = scratch_dir("sweep-freed");
  const auto file = sweep_file(dir, "s", "out",
                               "[[points]]\n\"train.pace_step_s\" = 1.0\n[[points]]\n\"train.lr\" = 2e-3\n");
  const auto folder = dir + "/out/points/lr=0.002";
  fs::create_directories(folder + "/checkpoints");
  write_text(folder + "/checkpoints/ckpt-00000001-0000000002.lwc", "another run's checkpoint");
  write_text(folder + "/metrics.jsonl", "another run's records\n");
  const int fd = hold_folder(folder);
  auto sweep = spawn({binary(), "sweep", file}, dir + "/s.log");
  // Point 1 trains 8 steps of at least 1 s each: the other run ends well before point 2's turn.
  CATCH_REQUIRE(wait_for_text(dir + "/s.log", "started; log:", 300));
  close(fd);
  const int code = wait_exit(sweep, 600);
  const auto out = read_text(dir + "/s.log");
  CATCH_INFO(out);
  CATCH_CHECK(code == 0);
  const auto kept = dir + "/out/superseded/lr=0.002";
  CATCH_CHECK(
      out.find("point 2/2 (train.lr=0.002): its folder held a run of other settings (in use when the sweep "
               "began); moved to " +
               kept) != std::string::npos);
  CATCH_CHECK(read_text(kept + "/metrics.jsonl") == "another run's records\n");
  CATCH_CHECK(fs::exists(kept + "/checkpoints/ckpt-00000001-0000000002.lwc"));
  const auto rows = read_csv(dir + "/out/results.csv");
  CATCH_REQUIRE(rows.size() == 2);
  CATCH_CHECK(rows[1].at("status") == "done");
  fs::remove_all(dir);
}

CATCH_TEST_CASE("after a SIGKILLed sweep, --results-only says its running point was interrupted",
                "[process][sweep]") {
  // A probe: the point stayed "running" in results.csv with nothing running.
  const auto dir = scratch_dir("sweep-killed");
  const auto file = sweep_file(dir, "s", "out", "[[points]]\n\"train.pace_step_s\" = 1.0\n");
  auto sweep = spawn({binary(), "sweep", file}, dir + "/s.log");
  // Its run holds the point's folder (it takes the lock before it reads its data).
  CATCH_REQUIRE(wait_for_text(dir + "/out/points/pace_step_s=1/log.txt", "data: ", 300));
  CATCH_REQUIRE(kill(sweep.pid, SIGKILL) == 0);
  CATCH_CHECK(wait_exit(sweep, 60) == 128 + SIGKILL);
  // Its point ends too (a parent-death signal): once its folder's lock is free.
  const auto lock = dir + "/out/points/pace_step_s=1/.longwave.lock";
  CATCH_REQUIRE(wait_until(
      [&] {
        const int fd = open(lock.c_str(), O_RDWR | O_CLOEXEC);
        const bool free = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
        if (fd >= 0) close(fd);
        return free;
      },
      120));
  auto [code, out] = run({binary(), "sweep", file, "--results-only"}, dir + "/r.log", 300);
  CATCH_INFO(out);
  CATCH_CHECK(code == 0);
  const auto rows = read_csv(dir + "/out/results.csv");
  CATCH_REQUIRE(rows.size() == 1);
  CATCH_CHECK(rows[0].at("status") == "interrupted");
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a point that fails is recorded with its exit code and the sweep goes on, then exits 1",
                "[process][sweep]") {
  const auto dir = scratch_dir("sweep-fail");
  write_text(dir + "/empty.txt", "");
  const auto file =
      sweep_file(dir, "f", "out",
                 "[[points]]\n\"data.path\" = \"" + dir + "/empty.txt\"\n[[points]]\n\"train.lr\" = 2e-3\n");
  auto [code, out] = run({binary(), "sweep", file}, dir + "/f.log", 600);
  CATCH_INFO(out);
  CATCH_CHECK(code == 1);
  CATCH_CHECK(out.find("point 1/2") != std::string::npos);
  CATCH_CHECK(out.find("FAILED: exit code 2") != std::string::npos);
  CATCH_CHECK(out.find("is empty") != std::string::npos);  // the log's last line says why
  CATCH_CHECK(out.find("1 point(s) failed") != std::string::npos);
  const auto rows = read_csv(dir + "/out/results.csv");
  CATCH_REQUIRE(rows.size() == 2);
  CATCH_CHECK(rows[0].at("status") == "failed");
  CATCH_CHECK(rows[0].at("exit_code") == "2");
  CATCH_CHECK(rows[1].at("status") == "done");
  // --results-only writes the table (exit 0) and counts the points not done (it said "1 of 2 points done").
  auto [rcode, rout] = run({binary(), "sweep", file, "--results-only"}, dir + "/results-only.log", 120);
  CATCH_INFO(rout);
  CATCH_CHECK(rcode == 0);
  CATCH_CHECK(rout.find("(1 of 2 points done, 1 failed)") != std::string::npos);
  // Point 1's folder held by a live run (a point an earlier sweep left stopped): not started, its record
  // untouched (the run refused it with exit 4 and the sweep wrote "failed" over the record).
  {
    const auto folder = fs::path(rows[0].at("log")).parent_path().string();
    const int fd = hold_folder(folder);
    const auto record = read_text(folder + "/point.json");
    auto [ucode, uout] = run({binary(), "sweep", file}, dir + "/in-use.log", 600);
    close(fd);
    CATCH_INFO(uout);
    CATCH_CHECK(ucode == 1);
    CATCH_CHECK(uout.find("its folder is in use by another longwave run (pid " + std::to_string(getpid())) !=
                std::string::npos);
    CATCH_CHECK(read_text(folder + "/point.json") == record);
    CATCH_CHECK(read_csv(dir + "/out/results.csv")[0].at("status") == "in use");
    CATCH_CHECK(read_csv(dir + "/out/results.csv")[0].at("exit_code").empty());  // it did not run
  }
  // The sweep file changed under the same out_dir: the plan says which points start over.
  const auto changed =
      sweep_file(dir, "f", "out",
                 "[[points]]\n\"data.path\" = \"" + dir + "/empty.txt\"\n[[points]]\n\"train.lr\" = 2e-3\n",
                 "set = [\"eval.batches=3\"]\n");
  auto [dry_code, dry] = run({binary(), "sweep", changed, "--dry-run"}, dir + "/dry.log", 120);
  CATCH_INFO(dry);
  CATCH_CHECK(dry_code == 0);
  CATCH_CHECK(dry.find("2 of them start over: their folders hold runs of other settings") !=
              std::string::npos);
  // Results that cannot be written (a directory where results.csv goes): exit 1, said, no .tmp left.
  fs::create_directories(dir + "/blocked/results.csv");
  auto [bcode, bout] =
      run({binary(), "sweep", sweep_file(dir, "b", "blocked", "[[points]]\n\"train.lr\" = 2e-3\n")},
          dir + "/b.log", 600);
  CATCH_INFO(bout);
  CATCH_CHECK(bcode == 1);
  CATCH_CHECK(bout.find("of the sweep's output files could not be written") != std::string::npos);
  CATCH_CHECK_FALSE(fs::exists(dir + "/blocked/results.csv.tmp"));
  CATCH_CHECK(fs::exists(dir + "/blocked/sweep.html"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("bad sweep files and options exit 2 naming the entry before anything runs",
                "[process][sweep]") {
  const auto dir = scratch_dir("sweep-bad");
  struct bad_case {
    std::string body, says;
  };
  const std::vector<bad_case> cases = {
      {"[grid]\n\"train.workerz\" = [1, 2]\n",
       "grid \"train.workerz\": config error: unknown key 'train.workerz'"},
      {"[grid]\n\"train.inner_steps\" = []\n", "grid \"train.inner_steps\": empty list"},
      {"[grid]\n\"train.workers\" = [1, \"two\"]\n", "grid \"train.workers\": config error: train.workers"},
      {"[[points]]\n\"model.preset\" = \"huge\"\n", "[[points]] #1 \"model.preset\": config error"},
      {"[grid]\n\"model.dim\" = [48, 96]\n[fit]\n", "fit: has 2 distinct sizes (params)"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto file = sweep_file(dir, "bad" + std::to_string(i), "out", cases[i].body);
    auto [code, out] = run({binary(), "sweep", file}, dir + "/bad.log", 60);
    CATCH_INFO(out);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(cases[i].says) != std::string::npos);
    CATCH_CHECK(out.find(file) != std::string::npos);
    CATCH_CHECK(occurrences(out, "\n") == 1);
    CATCH_CHECK_FALSE(fs::exists(dir + "/out"));
  }
  auto [hcode, help] = run({binary(), "sweep", "--help"}, dir + "/help.log", 60);
  CATCH_CHECK(hcode == 0);
  CATCH_CHECK(help.find("--parallel") != std::string::npos);
  CATCH_CHECK(help.find("[grid]") != std::string::npos);
  const auto good = sweep_file(dir, "good", "out", "[grid]\n\"train.lr\" = [1e-3, 2e-3]\n");
  auto [ucode, unknown] = run({binary(), "sweep", good, "--nope"}, dir + "/unknown.log", 60);
  CATCH_CHECK(ucode == 2);
  auto [pcode, parallel] = run({binary(), "sweep", good, "--parallel", "lots"}, dir + "/parallel.log", 60);
  CATCH_CHECK(pcode == 2);
  // --dry-run checks and prints the plan, and runs nothing.
  auto [dcode, dry] = run({binary(), "sweep", good, "--dry-run"}, dir + "/dry.log", 60);
  CATCH_INFO(dry);
  CATCH_CHECK(dcode == 0);
  CATCH_CHECK(dry.find("2 points (0 done earlier, 2 to run)") != std::string::npos);
  CATCH_CHECK(dry.find("point 1 runs: ") != std::string::npos);
  CATCH_CHECK_FALSE(fs::exists(dir + "/out"));
  // The command is the one the sweep would start: the plan's threads and --fresh are in it (they were not).
  const auto zero = sweep_file(dir, "zero", "out", "[grid]\n\"train.lr\" = [1e-3, 2e-3]\n",
                               "set = [\"train.threads=0\"]\n");
  auto [d2code, dry2] =
      run({binary(), "sweep", zero, "--dry-run", "--parallel", "2", "--fresh"}, dir + "/dry2.log", 60);
  CATCH_INFO(dry2);
  CATCH_CHECK(d2code == 0);
  const auto line = dry2.substr(dry2.find("point 1 runs: "));
  CATCH_CHECK(line.substr(0, line.find('\n')).find("--set train.threads=") != std::string::npos);
  CATCH_CHECK(line.substr(0, line.find('\n')).find(" --fresh") != std::string::npos);
  // One fixed metrics port for points that run at once: refused before any runs (the second point failed
  // to bind it); one at a time it is fine.
  const auto port = sweep_file(dir, "port", "out", "[grid]\n\"train.lr\" = [1e-3, 2e-3]\n",
                               "parallel = 2\nset = [\"metrics.enabled=true\", \"metrics.port=47999\"]\n");
  auto [mcode, mout] = run({binary(), "sweep", port, "--dry-run"}, dir + "/port.log", 60);
  CATCH_INFO(mout);
  CATCH_CHECK(mcode == 2);
  CATCH_CHECK(mout.find("both serve metrics on port 47999 and may run at once") != std::string::npos);
  auto [m1code, m1out] =
      run({binary(), "sweep", port, "--dry-run", "--parallel", "1"}, dir + "/port1.log", 60);
  CATCH_CHECK(m1code == 0);
  CATCH_CHECK_FALSE(fs::exists(dir + "/out"));
  // The command it prints is one a shell runs as it is, a value with a quote and spaces in it too (each
  // --set was put in single quotes as it stood).
  const auto quoted = sweep_file(dir, "quoted", "out", "[grid]\n\"train.lr\" = [1e-3, 2e-3]\n",
                                 "set = [\"run.name=it's a name\"]\n");
  auto [qcode, qdry] = run({binary(), "sweep", quoted, "--dry-run"}, dir + "/quoted.log", 60);
  CATCH_INFO(qdry);
  CATCH_REQUIRE(qcode == 0);
  const auto at = qdry.find("point 1 runs: ");
  CATCH_REQUIRE(at != std::string::npos);
  const auto cmd = qdry.substr(at + 14, qdry.find('\n', at) - at - 14);
  auto [scode, sdry] = run({"/bin/sh", "-c", cmd + " --dry-run"}, dir + "/shell.log", 60);
  CATCH_INFO(cmd << "\n" << sdry);
  CATCH_CHECK(scode == 0);
  CATCH_CHECK(sdry.find("name = \"it's a name\"") != std::string::npos);
  fs::remove_all(dir);
}
