// Unit tests for `longwave sweep`'s torch-free parts: expanding a sweep file (grid x points x seeds), the
// errors that name the entry at fault, the parallelism decision, the results files and the scaling-law fit.
#include <catch2/catch.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/report/charts.hpp"
#include "cli/report/format.hpp"
#include "cli/sweep/fit.hpp"
#include "cli/sweep/results.hpp"
#include "cli/sweep/runner.hpp"
#include "cli/sweep/scaling.hpp"
#include "cli/sweep/sweep_file.hpp"
#include "runtime/process/cores.hpp"
#include "runtime/process/proc_state.hpp"

using Catch::Matchers::Contains;
using namespace longwave::cli::sweep;
namespace fs = std::filesystem;
namespace runtime = longwave::runtime;

namespace {

/// A scratch directory with base.toml, removed at the end of the test.
struct scratch {
  fs::path dir;
  scratch() {
    dir = fs::temp_directory_path() / ("longwave-sweep-unit-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "configs");
    std::ofstream(dir / "configs" / "base.toml") << "[run]\nseed = 100\n[train]\nworkers = 2\nrounds = 3\n";
  }
  ~scratch() { fs::remove_all(dir); }
  std::string sweep_path() const { return (dir / "s.toml").string(); }
  /// A sweep file's [sweep] section with the base one folder down, plus `rest`.
  std::string text(const std::string& rest, const std::string& extra_sweep = "") const {
    return "[sweep]\nbase = \"configs/base.toml\"\nout_dir = \"" + (dir / "out").string() + "\"\n" +
           extra_sweep + rest;
  }
};

/// parse_sweep's error message, or "" when the text is accepted.
std::string error_of(const scratch& s, const std::string& text) {
  try {
    (void)parse_sweep(text, s.sweep_path());
  } catch (const sweep_error& e) {
    return e.what();
  }
  return "";
}

/// "1, 2, ..., n": a TOML list's values.
std::string counting(int n) {
  std::string out;
  for (int i = 1; i <= n; ++i) out += (i > 1 ? ", " : "") + std::to_string(i);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// Counts parameters like a model whose size is its width: what a param_counter does, without libtorch.
double width_squared(const longwave::config::train_config& c) {
  return static_cast<double>(c.model.dim * c.model.dim);
}

}  // namespace

CATCH_TEST_CASE("a sweep expands to repeats x points x grid, in that order, each with its own overrides",
                "[unit][sweep]") {
  scratch d;
  const auto s = parse_sweep(d.text(R"(
[grid]
"train.inner_steps" = [5, 10]
model.preset = ["tiny", "small"]
[[points]]
name = "diloco"
"run.mode" = "diloco"
[[points]]
name = "single"
run.mode = "single"
train.workers = 1
)",
                                    "repeats = 2\nset = [\"train.rounds=4\"]\n"),
                             d.sweep_path());
  CATCH_REQUIRE(s.points.size() == 16);
  CATCH_CHECK(s.base == (d.dir / "configs" / "base.toml").lexically_normal().string());
  CATCH_CHECK(s.keys == std::vector<std::string>{"name", "run.mode", "train.workers", "train.inner_steps",
                                                 "model.preset"});
  // The first grid key varies slowest, the repeat slowest of all.
  const auto& p0 = s.points[0];
  CATCH_CHECK(p0.name == "diloco");
  CATCH_CHECK(p0.label(true) == "name=diloco run.mode=diloco train.inner_steps=5 model.preset=tiny seed=100");
  CATCH_CHECK(s.points[1].label(false) ==
              "name=diloco run.mode=diloco train.inner_steps=5 model.preset=small");
  CATCH_CHECK(s.points[2].value_of("train.inner_steps") == "10");
  CATCH_CHECK(s.points[4].name == "single");
  CATCH_CHECK(s.points[4].cfg.train.workers == 1);
  CATCH_CHECK(s.points[8].seed == 101);
  CATCH_CHECK(s.points[8].label(false) == p0.label(false));
  // The resolved configs: the base, [sweep] set, then the point's values, seed and out_dir.
  CATCH_CHECK(p0.cfg.train.rounds == 4);
  CATCH_CHECK(p0.cfg.train.workers == 2);
  CATCH_CHECK(p0.cfg.model.preset == "tiny");
  CATCH_CHECK(p0.cfg.run.out_dir == p0.out_dir);
  CATCH_CHECK(p0.out_dir == (d.dir / "out" / "points" / p0.id).string());
  CATCH_CHECK(has(p0.overrides, "train.rounds=4"));
  CATCH_CHECK(has(p0.overrides, "model.preset=\"tiny\""));
  CATCH_CHECK(has(p0.overrides, "run.seed=100"));
  CATCH_CHECK(p0.value_of("train.workers") == "2");  // not swept by this point: the resolved value
  CATCH_CHECK(p0.thread_need() == 2);
  std::set<std::string> ids;
  for (const auto& p : s.points) {
    ids.insert(p.id);
    CATCH_CHECK(p.id.find('/') == std::string::npos);
  }
  CATCH_CHECK(ids.size() == s.points.size());
  CATCH_CHECK(p0.id == "diloco_mode=diloco_inner_steps=5_preset=tiny_s100");
}

CATCH_TEST_CASE("a sweep with explicit seeds and no grid runs each point once per seed", "[unit][sweep]") {
  scratch d;
  const auto s = parse_sweep(d.text("[[points]]\n\"train.lr\" = 1e-3\n[[points]]\n\"train.lr\" = 2e-3\n",
                                    "seeds = [7, 9]\nparallel = 3\n"),
                             d.sweep_path());
  CATCH_REQUIRE(s.points.size() == 4);
  CATCH_CHECK(s.parallel == 3);
  CATCH_CHECK(s.points[0].seed == 7);
  CATCH_CHECK(s.points[3].seed == 9);
  CATCH_CHECK(s.points[1].cfg.train.lr == Approx(2e-3));
  CATCH_CHECK(s.points[0].value_of("train.lr") == "0.001");
  // A sweep of nothing is the base config once.
  const auto one = parse_sweep(d.text(""), d.sweep_path());
  CATCH_REQUIRE(one.points.size() == 1);
  CATCH_CHECK(one.points[0].id == "base");
}

CATCH_TEST_CASE("bad sweep files are refused with one line naming the entry", "[unit][sweep]") {
  scratch d;
  struct bad {
    std::string text, extra_sweep, expect;
  };
  const std::vector<bad> cases = {
      {"[grid]\n\"train.workerz\" = [1, 2]\n", "", "grid \"train.workerz\": config error: unknown key"},
      {"[grid]\n\"train.workerz\" = [1, 2]\n", "", "did you mean 'train.workers'"},
      {"[grid]\n\"train.workers\" = [1, \"four\"]\n", "",
       "grid \"train.workers\": config error: train.workers"},
      {"[grid]\n\"train.inner_steps\" = []\n", "", "grid \"train.inner_steps\": empty list"},
      {"[grid]\n\"train.inner_steps\" = 5\n", "", "grid \"train.inner_steps\": expected a list of values"},
      {"[grid]\n\"train.inner_steps\" = [5, 5]\n", "", "5 is listed twice"},
      {"[grid]\n\"train.lr\" = [[1.0]]\n", "", "grid \"train.lr\": a value is an array"},
      {"[[points]]\n\"train.workers\" = \"four\"\n", "", "[[points]] #1 \"train.workers\": config error"},
      {"[[points]]\n\"run.mode\" = \"single\"\n", "", "point run.mode=single: config error: train.workers"},
      {"[grid]\n\"train.workers\" = [1, 2]\n[[points]]\n\"train.workers\" = 1\n", "",
       "grid \"train.workers\": also set in [[points]]"},
      {"[[points]]\nname = \"a\"\n[[points]]\n\"train.lr\" = 0.1\n", "",
       "[[points]] #2: name every point or none"},
      {"[grid]\n\"run.out_dir\" = [\"x\"]\n", "", "grid \"run.out_dir\": each point's run.out_dir"},
      {"[grid]\n\"checkpoint.dir\" = [\"x\", \"y\"]\n", "",
       "grid \"checkpoint.dir\": each point keeps its checkpoints"},
      {"", "set = [\"checkpoint.dir=\\\"x\\\"\"]\n", "sweep.set \"checkpoint.dir=\"x\"\": each point keeps"},
      {"[grid]\n\"run.seed\" = [1, 2]\n", "repeats = 2\n",
       "grid \"run.seed\": repeats or seeds set run.seed"},
      {"", "repeats = 0\n", "sweep.repeats: must be an integer in 1..10000"},
      {"", "parallel = \"lots\"\n", "sweep.parallel: must be \"auto\" or an integer"},
      {"", "threads = 2\n", "sweep.threads: unknown key"},
      {"", "set = [\"train.bogus=1\"]\n", "sweep.set \"train.bogus=1\": config error: unknown key"},
      {"[gird]\n", "", "gird: unknown entry"},
      {"[[points]]\n\"train.lr\" = 0.1\n[[points]]\n\"train.lr\" = 0.1\n", "",
       "the same settings as point 1"},
      // The base config has train.workers = 2 already: the second point trains as the first.
      {"[[points]]\n\"train.rounds\" = 4\n[[points]]\n\"train.rounds\" = 4\n\"train.workers\" = 2\n", "",
       "point 2 (train.rounds=4 train.workers=2 seed=100): the same settings as point 1"},
      {"[grid]\n\"train.lr\" = [0.1, 0.2]\n[fit]\nsize = \"model.dim\"\n", "",
       "fit.size: \"model.dim\" is not a swept key"},
      {"[grid]\n\"model.dim\" = [96, 192]\n[fit]\nsize = \"model.dim\"\n", "", "fit: has 2 distinct sizes"},
      {"[grid]\n\"model.dim\" = [96, 192, 384]\n[fit]\nsize = \"model.dim\"\ngroup_by = [\"run.mode\"]\n", "",
       "fit.group_by \"run.mode\": is not a swept key"},
      {"[sweep]\n", "", "syntax error"},  // [sweep] twice
      // One key given twice: a quoted and a dotted key (the table named one value and the run the other).
      {"[[points]]\n\"train.inner_steps\" = 2\ntrain.inner_steps = 3\n", "",
       "[[points]] #1 \"train.inner_steps\": given twice"},
      {"[grid]\n\"train.inner_steps\" = [2]\n[grid.train]\ninner_steps = [3]\n", "",
       "grid \"train.inner_steps\": given twice"},
      {"", "set = [\"train.lr=0.1\", \" train.lr = 0.2\"]\n", "sweep.set: \"train.lr\" is set twice"},
      // 1024^6 x 16 = 2^64 points: the count wrapped to 0 and passed the limit.
      {"[grid]\n\"train.rounds\" = [" + counting(1024) + "]\n\"train.warmup_steps\" = [" + counting(1024) +
           "]\n\"eval.batches\" = [" + counting(1024) + "]\n\"train.inner_steps\" = [" + counting(1024) +
           "]\n\"eval.every_rounds\" = [" + counting(1024) + "]\n\"checkpoint.every_rounds\" = [" +
           counting(1024) + "]\n",
       "repeats = 16\n",
       "grid: more than 100000 points (1 [[points]] entries x 16 repeats x the grid's 1024 x 1024"},
      // Points that differ only in a key their mode leaves without effect train alike.
      {"[[points]]\n\"run.mode\" = \"ddp\"\n\"outer.lr\" = 0.5\n[[points]]\n\"run.mode\" = \"ddp\"\n"
       "\"outer.lr\" = 0.7\n",
       "",
       "point 2 (run.mode=ddp outer.lr=0.7 seed=100): the same settings as point 1: outer.lr is set, but"},
  };
  for (const auto& c : cases) {
    const auto msg = error_of(d, d.text(c.text, c.extra_sweep));
    CATCH_INFO(c.text << " -> " << msg);
    CATCH_CHECK_THAT(msg, Contains(c.expect));
    CATCH_CHECK_THAT(msg, Contains(d.sweep_path()));
    CATCH_CHECK(msg.find('\n') == std::string::npos);
  }
  CATCH_CHECK_THAT(error_of(d, "[sweep]\nout_dir = \"x\"\n"), Contains("sweep.base: missing"));
  CATCH_CHECK_THAT(error_of(d, "[sweep]\nbase = \"\"\nout_dir = \"x\"\n"),
                   Contains("sweep.base: is empty: name a path"));
  CATCH_CHECK_THAT(error_of(d, "[sweep]\nbase = \"nope.toml\"\nout_dir = \"x\"\n"),
                   Contains("sweep.base: config error: cannot read config file"));
  CATCH_CHECK_THAT(error_of(d, "[grid]\n\"model.dim\" = [1]\n"), Contains("[sweep]"));
  // A base the sweep changes nothing of, with an unknown section: the base is named (it said "point : ").
  std::ofstream(d.dir / "bad_base.toml") << "[trian]\nworkers = 2\n";
  CATCH_CHECK_THAT(
      error_of(d, "[sweep]\nbase = \"" + (d.dir / "bad_base.toml").string() + "\"\nout_dir = \"x\"\n"),
      Contains("sweep.base \"" + (d.dir / "bad_base.toml").string() + "\": config error: unknown section"));
  std::ofstream(d.dir / "file") << "x";
  const std::string under =
      "[sweep]\nbase = \"configs/base.toml\"\nout_dir = \"" + (d.dir / "file" / "out").string();
  CATCH_CHECK_THAT(
      error_of(d, under + "\"\n"),
      Contains("sweep.out_dir: \"" + (d.dir / "file" / "out").string() + "\": \"" +
               (d.dir / "file").string() + "\" is a file, not a directory; choose another out_dir"));
  // A directory of the user's that holds a results.csv no sweep wrote (it replaced theirs), and one a sweep
  // used before (sweep.lock), whose results it writes again.
  fs::create_directories(d.dir / "mine");
  std::ofstream(d.dir / "mine" / "results.csv") << "my,own\n";
  const std::string mine = "[sweep]\nbase = \"configs/base.toml\"\nout_dir = \"" + (d.dir / "mine").string();
  CATCH_CHECK_THAT(error_of(d, mine + "\"\n"), Contains("sweep.out_dir: \"" + (d.dir / "mine").string() +
                                                        "\" holds a results.csv that no sweep wrote"));
  std::ofstream(d.dir / "mine" / "sweep.lock") << "1\n";
  CATCH_CHECK(error_of(d, mine + "\"\n") == "");
}

CATCH_TEST_CASE("a point's identity leaves out what changes no loss, unless the sweep varies it",
                "[unit][sweep]") {
  scratch d;
  // Swept: two points (a checkpoint's wall-time cost is a fair question), each with its own fingerprint.
  const auto swept =
      parse_sweep(d.text("[grid]\n\"checkpoint.every_rounds\" = [1, 2]\n", ""), d.sweep_path());
  CATCH_REQUIRE(swept.points.size() == 2);
  CATCH_CHECK(config_fingerprint(swept.points[0]) != config_fingerprint(swept.points[1]));
  // Set for every point: its fingerprint is the one without it, so a done point is not run again.
  const auto plain = parse_sweep(d.text("[grid]\n\"train.lr\" = [0.1, 0.2]\n", ""), d.sweep_path());
  const auto kept = parse_sweep(d.text("[grid]\n\"train.lr\" = [0.1, 0.2]\n",
                                       "set = [\"checkpoint.keep=1\", \"runtime.log_every_steps=3\"]\n"),
                                d.sweep_path());
  CATCH_REQUIRE(kept.points.size() == 2);
  CATCH_CHECK(config_fingerprint(kept.points[1]) == config_fingerprint(plain.points[1]));
  CATCH_CHECK(config_fingerprint(kept.points[0]) != config_fingerprint(kept.points[1]));
  // A record of the earlier identity (names and directories left out, nothing else) is the same point's.
  const auto fps = config_fingerprints(plain.points[0]);
  CATCH_REQUIRE(fps.size() == 3);
  CATCH_CHECK(fps[0] == config_fingerprint(plain.points[0]));
}

CATCH_TEST_CASE("a swept key that a point's mode leaves without effect is a warning of the plan",
                "[unit][sweep]") {
  scratch d;
  const auto s = parse_sweep(d.text("[[points]]\n\"run.mode\" = \"ddp\"\n\"outer.lr\" = 0.5\n[[points]]\n"
                                    "\"run.mode\" = \"diloco\"\n\"outer.lr\" = 0.5\n"),
                             d.sweep_path());
  CATCH_CHECK(s.points.size() == 2);
  CATCH_CHECK(s.warnings ==
              std::vector<std::string>{"1 of the points: outer.lr is set, but it applies only with "
                                       "run.mode = \"diloco\" (this run's is \"ddp\"): it has no "
                                       "effect"});
}

CATCH_TEST_CASE("points whose ids come out the same get their own folders, checkpoints included",
                "[unit][sweep]") {
  scratch d;
  const auto s =
      parse_sweep(d.text("[grid]\n\"data.cache_dir\" = [\"cache a\", \"cache_a\"]\n"), d.sweep_path());
  CATCH_REQUIRE(s.points.size() == 2);
  CATCH_CHECK(s.points[0].id != s.points[1].id);
  for (const auto& p : s.points) {
    CATCH_INFO(p.id);
    CATCH_CHECK(p.cfg.run.out_dir == p.out_dir);
    CATCH_CHECK(p.cfg.checkpoint.dir == p.out_dir + "/checkpoints");
    CATCH_CHECK(has(p.overrides, "checkpoint.dir=\"" + p.out_dir + "/checkpoints\""));
  }
}

CATCH_TEST_CASE("a sweep checks its fit sizes before anything runs when the parameter count is known",
                "[unit][sweep]") {
  scratch d;
  const auto text = d.text(R"(
[grid]
"model.dim" = [96, 192, 384]
[[points]]
name = "a"
[[points]]
name = "b"
"train.workers" = 1
"run.mode" = "single"
[fit]
)");
  const auto s = parse_sweep(text, d.sweep_path(), width_squared);
  CATCH_CHECK(s.fit.enabled);
  CATCH_CHECK(s.fit.size == "params");
  CATCH_CHECK(s.fit.group_by == std::vector<std::string>{"name", "train.workers", "run.mode"});
  CATCH_CHECK(s.points[2].params == 384.0 * 384.0);
  std::string msg;
  try {
    (void)parse_sweep(d.text("[grid]\n\"model.dim\" = [96, 192]\n[fit]\n"), d.sweep_path(), width_squared);
  } catch (const sweep_error& e) {
    msg = e.what();
  }
  CATCH_CHECK_THAT(msg,
                   Contains("fit: has 2 distinct sizes (params); fitting A, alpha and E needs at least 3"));
}

CATCH_TEST_CASE(
    "sweep parallel = auto packs points by their threads and pins train.threads = 0 to one per worker",
    "[unit][sweep]") {
  scratch d;
  const auto s = parse_sweep(d.text("[grid]\n\"train.workers\" = [1, 2, 4]\n"), d.sweep_path());
  std::vector<const sweep_point*> all;
  for (const auto& p : s.points) all.push_back(&p);
  const auto pl = plan_parallel(0, 8, all);
  CATCH_CHECK(pl.pack_by_threads);
  CATCH_CHECK(pl.at_once == 3);
  CATCH_CHECK(pl.threads_for(s.points[2]) == 1);
  CATCH_CHECK_THAT(pl.text, Contains("8 cores; each point needs 1-4 threads"));
  // No two points fit: one at a time, threads left to the run.
  const auto serial = plan_parallel(0, 1, all);
  CATCH_CHECK_FALSE(serial.pack_by_threads);
  CATCH_CHECK(serial.limit == 1);
  CATCH_CHECK(serial.threads_for(s.points[0]) == 0);
  CATCH_CHECK_THAT(serial.text, Contains("one point at a time"));
  // An integer: that many at once, the cores shared out.
  const auto two = plan_parallel(2, 8, all);
  CATCH_CHECK(two.limit == 2);
  CATCH_CHECK(two.threads_for(s.points[1]) == 2);  // 8 / (2 x 2 workers)
  // More than there are points: as many as there are (it said "parallel = 8 runs 8 points at once" of 3).
  CATCH_CHECK_THAT(plan_parallel(8, 64, all).text, Contains("parallel = 8 runs 3 points at once"));
  // One at a time never oversubscribes, whatever a point needs.
  CATCH_CHECK_THAT(plan_parallel(1, 2, all).text, !Contains("more threads than cores"));
  CATCH_CHECK_THAT(plan_parallel(3, 2, all).text, Contains("more threads than cores"));
}

CATCH_TEST_CASE("the cores a process may use follow its affinity, and OMP_NUM_THREADS caps its torch threads",
                "[unit][sweep][cores]") {
  const char* saved_env = std::getenv("OMP_NUM_THREADS");
  const std::string saved = saved_env ? saved_env : "";
  ::unsetenv("OMP_NUM_THREADS");
  cpu_set_t all;
  CPU_ZERO(&all);
  CATCH_REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  CATCH_CHECK(runtime::usable_cores() == static_cast<size_t>(CPU_COUNT(&all)));
  CATCH_CHECK(runtime::torch_thread_budget().threads == runtime::usable_cores());
  CATCH_CHECK_FALSE(runtime::torch_thread_budget().from_omp_env);
  // Held to one CPU (as taskset or a container's cpuset would), whatever the machine has.
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  CATCH_REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  CATCH_CHECK(runtime::usable_cores() == 1);
  CATCH_CHECK(runtime::torch_thread_budget().threads == 1);
  CATCH_REQUIRE(sched_setaffinity(0, sizeof all, &all) == 0);
  // OMP_NUM_THREADS: a positive count, or a list's first; anything else leaves the cores.
  for (const auto& [value, want] :
       std::vector<std::pair<std::string, size_t>>{{"3", 3},
                                                   {"5,2", 5},
                                                   {"0", runtime::usable_cores()},
                                                   {"many", runtime::usable_cores()},
                                                   {"-2", runtime::usable_cores()},
                                                   {"4x", runtime::usable_cores()}}) {
    CATCH_INFO("OMP_NUM_THREADS=" << value);
    ::setenv("OMP_NUM_THREADS", value.c_str(), 1);
    CATCH_CHECK(runtime::torch_thread_budget().threads == want);
    CATCH_CHECK(runtime::torch_thread_budget().from_omp_env == (value == "3" || value == "5,2"));
  }
  if (saved_env)
    ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    ::unsetenv("OMP_NUM_THREADS");
}

CATCH_TEST_CASE("the sweep fit recovers A, alpha and E of exact and of noisy power laws", "[unit][sweep]") {
  const double a = 420, alpha = 0.34, e = 1.69;
  std::vector<double> n, loss;
  for (const double x : {1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8})
    n.push_back(x), loss.push_back(a * std::pow(x, -alpha) + e);
  const auto exact = fit_power_law(n, loss);
  CATCH_REQUIRE(exact.ok);
  CATCH_CHECK(exact.a == Approx(a).epsilon(1e-4));
  CATCH_CHECK(exact.alpha == Approx(alpha).epsilon(1e-5));
  CATCH_CHECK(exact.e == Approx(e).epsilon(1e-5));
  CATCH_CHECK(exact.rms < 1e-6);
  CATCH_CHECK(exact.n == 7);
  CATCH_CHECK(exact.at(1e6) == Approx(a * std::pow(1e6, -alpha) + e));

  // 1 % noise, two seeds per size: the truth lies within a few standard errors.
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 0.01);
  std::vector<double> n2, loss2;
  for (size_t i = 0; i < n.size(); ++i)
    for (int k = 0; k < 2; ++k) n2.push_back(n[i]), loss2.push_back(loss[i] * (1 + noise(rng)));
  const auto noisy = fit_power_law(n2, loss2);
  CATCH_REQUIRE(noisy.ok);
  CATCH_CHECK(std::isfinite(noisy.alpha_err));
  CATCH_CHECK(std::abs(noisy.alpha - alpha) < 4 * noisy.alpha_err + 0.02);
  CATCH_CHECK(std::abs(noisy.e - e) < 4 * noisy.e_err + 0.05);
  CATCH_CHECK(noisy.rms > 0.005);
  CATCH_CHECK(noisy.rms < 0.1);

  // No floor: E at 0.
  std::vector<double> pure;
  for (const double x : n) pure.push_back(3 * std::pow(x, -0.1));
  const auto zero = fit_power_law(n, pure);
  CATCH_REQUIRE(zero.ok);
  CATCH_CHECK(zero.e == Approx(0).margin(1e-6));
  CATCH_CHECK(zero.alpha == Approx(0.1).epsilon(1e-4));

  // Three sizes are enough for an exact fit (no error estimate), two are refused.
  const auto three = fit_power_law(
      {1e6, 1e7, 1e8},
      {a * std::pow(1e6, -alpha) + e, a * std::pow(1e7, -alpha) + e, a * std::pow(1e8, -alpha) + e});
  CATCH_REQUIRE(three.ok);
  CATCH_CHECK(three.alpha == Approx(alpha).epsilon(1e-4));
  CATCH_CHECK(std::isnan(three.alpha_err));
  const auto two = fit_power_law({1e6, 1e6, 1e7}, {3.0, 3.1, 2.5});
  CATCH_CHECK_FALSE(two.ok);
  CATCH_CHECK_THAT(two.problem, Contains("2 distinct sizes"));
  // A loss that rises with size, or one that is flat, is no scaling law (it was a fit with alpha < 0, ok).
  const auto rising = fit_power_law({1e6, 1e7, 1e8, 1e9}, {2.0, 2.5, 3.1, 3.8});
  CATCH_CHECK_FALSE(rising.ok);
  CATCH_CHECK_THAT(rising.problem, Contains("the loss does not fall as the sizes grow"));
  CATCH_CHECK_FALSE(fit_power_law({1e6, 1e7, 1e8}, {2.0, 2.0, 2.0}).ok);
}

CATCH_TEST_CASE("sweep results are one row per point in CSV and JSONL, and fits group by method",
                "[unit][sweep]") {
  scratch d;
  auto s = parse_sweep(d.text("[grid]\n\"model.dim\" = [96, 192, 384]\n[[points]]\nname = \"a\"\n[[points]]\n"
                              "name = \"b\"\n\"train.lr\" = 1e-3\n[fit]\n"),
                       d.sweep_path(), width_squared);
  fs::create_directories(s.out_dir);
  std::vector<point_result> results(s.points.size());
  for (size_t i = 0; i < s.points.size(); ++i) {
    auto& r = results[i];
    r.status = i == 5 ? "failed" : "done";
    r.exit_code = i == 5 ? 1 : 0;
    const double n = s.points[i].params, scale = s.points[i].name == "a" ? 1.0 : 2.0;
    r.val_loss = i == 5 ? NAN : 1.5 + scale * 30 * std::pow(n, -0.3);
    r.params = n;
    r.val_curve = {{1000, r.val_loss + 1}, {2000, r.val_loss + 0.5}, {4000, r.val_loss}};
  }
  CATCH_REQUIRE(write_results(s, results).empty());
  std::ifstream csv(fs::path(s.out_dir) / "results.csv");
  std::string header, row;
  std::getline(csv, header);
  CATCH_CHECK(header ==
              "id,name,train.lr,model.dim,seed,status,exit_code,val_loss,val_ppl,tokens,wall_s,bytes_sent,"
              "utilization,params,steps,log");
  size_t rows = 0;
  while (std::getline(csv, row)) ++rows;
  CATCH_CHECK(rows == s.points.size());
  std::ifstream jsonl(fs::path(s.out_dir) / "results.jsonl");
  std::getline(jsonl, row);
  CATCH_CHECK_THAT(row, Contains("\"model.dim\":96"));
  CATCH_CHECK_THAT(row, Contains("\"name\":\"a\""));
  // A results.csv that cannot be replaced (a directory there) does not keep results.jsonl from being written.
  fs::remove(fs::path(s.out_dir) / "results.csv");
  fs::remove(fs::path(s.out_dir) / "results.jsonl");
  fs::create_directories(fs::path(s.out_dir) / "results.csv" / "x");
  const auto failed = write_results(s, results);
  CATCH_CHECK(failed.size() == 1);
  CATCH_CHECK(fs::is_regular_file(fs::path(s.out_dir) / "results.jsonl"));
  fs::remove_all(fs::path(s.out_dir) / "results.csv");

  const auto fits = fit_scaling(s, results);
  CATCH_REQUIRE(fits.sizes.size() == 2);
  CATCH_CHECK(fits.sizes[0].group == "name=a train.lr=0.004");
  CATCH_CHECK(fits.sizes[0].fit.ok);
  CATCH_CHECK(fits.sizes[0].fit.alpha == Approx(0.3).epsilon(1e-3));
  CATCH_CHECK_FALSE(fits.sizes[1].fit.ok);  // its 384 point failed: two sizes left
  const auto lines = fit_lines(fits);
  CATCH_CHECK_THAT(lines[0], Contains("fit name=a train.lr=0.004: L(N) = A·N^-alpha + E, A="));
  CATCH_CHECK_THAT(lines[0], Contains("alpha=0.3"));
  CATCH_CHECK_THAT(lines[1], Contains("not fitted: 2 distinct sizes"));
  CATCH_CHECK(fits.tokens.size() == 5);  // L(D) per group and size that finished
  CATCH_CHECK_THAT(fits_json(fits), Contains("\"alpha\":"));
}

CATCH_TEST_CASE("text on a page is escaped and anything that is not UTF-8 text becomes U+FFFD",
                "[unit][report]") {
  using longwave::cli::report::html_escape;
  const std::string r = "\xEF\xBF\xBD";
  CATCH_CHECK(html_escape("a<b>&\"'") == "a&lt;b&gt;&amp;&quot;&#39;");
  CATCH_CHECK(html_escape("λ → 🙂 ok\tx\n") == "λ → 🙂 ok\tx\n");  // 2-, 3- and 4-byte forms kept
  CATCH_CHECK(html_escape("a\xFF"
                          "b") == "a" + r + "b");                                     // never a UTF-8 byte
  CATCH_CHECK(html_escape("\x80x") == r + "x");                                       // stray continuation
  CATCH_CHECK(html_escape("\xC3") == r);                                              // cut at the end
  CATCH_CHECK(html_escape("\xE2\x82x") == r + r + "x");                               // cut in the middle
  CATCH_CHECK(html_escape("\xC0\xAF") == r + r);                                      // overlong '/'
  CATCH_CHECK(html_escape("\xED\xA0\x80") == r + r + r);                              // a surrogate
  CATCH_CHECK(html_escape("\xF4\x90\x80\x80") == r + r + r + r);                      // past U+10FFFF
  CATCH_CHECK(html_escape(std::string("a\0b\x1b\x7f", 5)) == "a" + r + "b" + r + r);  // controls
}

CATCH_TEST_CASE("numbers beyond any run's print short: a diverged perplexity, a bad timestamp's span",
                "[unit][sweep]") {
  namespace report = longwave::cli::report;
  CATCH_CHECK(report::fixed(4.33291, 3) == "4.333");
  CATCH_CHECK(report::fixed(std::exp(537.0), 3).size() < 12);  // was 234 digits
  CATCH_CHECK(report::duration_text(1e300) == "1e+300 s");     // was a negative count of minutes
  CATCH_CHECK(report::duration_text(3725) == "1h 02m 05s");
  CATCH_CHECK(report::duration_text(59.96) == "1m 00s");  // was "60.0 s"
  CATCH_CHECK(report::duration_text(59.94) == "59.9 s");
  CATCH_CHECK(report::utc_text(1e300) == "–");
}

CATCH_TEST_CASE("the sweep tells a stopped point (SIGSTOP) from a running one by its /proc state",
                "[unit][sweep]") {
  const pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  CATCH_REQUIRE(child > 0);
  const auto waits_for = [&](bool stopped) {  // the kernel sets the state asynchronously
    for (int i = 0; i < 10000; ++i) {
      if (longwave::runtime::is_stopped(child) == stopped) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  CATCH_CHECK(waits_for(false));
  kill(child, SIGSTOP);
  CATCH_CHECK(waits_for(true));
  kill(child, SIGCONT);
  CATCH_CHECK(waits_for(false));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  CATCH_CHECK_FALSE(longwave::runtime::is_stopped(child));  // gone
}
