// Runs a sweep's points as `longwave run` children: scheduling by cores, progress and ETA, Ctrl-C, resume,
// and the results, page and fits after each point.
#include "cli/sweep/runner.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "cli/report/format.hpp"
#include "cli/sweep/page.hpp"
#include "cli/sweep/point_process.hpp"
#include "cli/sweep/results.hpp"
#include "cli/sweep/scaling.hpp"
#include "runtime/process/cores.hpp"
#include "runtime/process/proc_state.hpp"
#include "runtime/process/stop_signals.hpp"

namespace longwave::cli::sweep {

namespace {

namespace fs = std::filesystem;
using steady = std::chrono::steady_clock;

std::atomic<int> g_signals{0};  // Ctrl-C, SIGTERM, SIGHUP (runtime::count_stop_signals)

template <class... Args>
void say(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print("sweep: {}\n", fmt::format(f, std::forward<Args>(args)...));
  std::fflush(stdout);
}

double seconds_since(steady::time_point t) {
  return std::chrono::duration<double>(steady::now() - t).count();
}

/// A point's run in progress.
struct running {
  size_t point = 0;
  pid_t pid = -1;
  int64_t need = 1;
  steady::time_point started;
};

/// Whether p's folder holds checkpoints (of a run this sweep has no record of).
bool has_checkpoints(const sweep_point& p) {
  std::error_code ec;
  const fs::path dir = fs::path(p.out_dir) / "checkpoints";
  return fs::is_directory(dir, ec) && !fs::is_empty(dir, ec);
}

/// The sweep's state while it runs.
struct sweep_run {
  sweep_run(sweep_spec& spec, const sweep_options& opts) : s(spec), o(opts), results(spec.points.size()) {}

  sweep_spec& s;
  const sweep_options& o;
  parallel_plan plan;
  std::vector<point_result> results;
  std::vector<const sweep_point*> to_run;
  std::vector<running> active;
  std::set<std::string> write_warnings;             // the outputs' write failures said so far
  size_t next = 0, finished_now = 0, done_now = 0;  // points ended in this invocation, and of those done
  int64_t used_threads = 0;
  bool stopping = false;
  int handled_signals = 0;
  steady::time_point t0 = steady::now(), last_heartbeat = steady::now();
  const std::string fresh_dir = "superseded/fresh-" + utc_stamp();  // --fresh: where earlier runs move

  size_t n_done() const {
    return static_cast<size_t>(
        std::count_if(results.begin(), results.end(), [](auto& r) { return r.status == "done"; }));
  }

  std::string point_name(const sweep_point& p) const {
    return fmt::format("point {}/{} ({})", p.index + 1, s.points.size(),
                       p.label(s.has_repeats).empty() ? p.id : p.label(s.has_repeats));
  }

  /// Two points that may run at once with one fixed metrics port ([sweep] set "metrics.port=N"): the
  /// second failed to bind it (exit 2 mid-sweep). "" when none.
  std::string shared_metrics_port() const {
    if (plan.at_once < 2) return {};
    std::map<int64_t, const sweep_point*> by_port;
    for (const auto* p : to_run) {
      if (!p->cfg.metrics.enabled || p->cfg.metrics.port == 0) continue;
      const auto [at, fresh] = by_port.emplace(p->cfg.metrics.port, p);
      if (!fresh)
        return fmt::format(
            "{} and {} both serve metrics on port {} and may run at once (up to {}): leave "
            "metrics.port unset, as a sweep does (each point picks a free port), give each "
            "point its own, or set parallel = 1",
            point_name(*at->second), point_name(*p), p->cfg.metrics.port, plan.at_once);
    }
    return {};
  }

  /// ", ETA ..." from the points done in this invocation (one that failed early says nothing of the time a
  /// point takes); "" once none is left.
  std::string eta() const {
    if (finished_now >= to_run.size()) return "";
    if (done_now == 0) return ", ETA after the first point";
    const double left = static_cast<double>(to_run.size() - finished_now);
    return ", ETA " + report::duration_text(seconds_since(t0) / static_cast<double>(done_now) * left);
  }

  /// A done point whose metrics.jsonl could not be read (read_run's why): its row lacks what only they hold.
  void note_unread(const sweep_point& p, const std::string& why) const {
    if (!why.empty()) say("warning: {}: {}", point_name(p), why);
  }

  /// results.csv, results.jsonl, fit.json and sweep.html as they stand.
  /// Writes results.csv/.jsonl, fit.json and sweep.html; returns how many could not be written (each said).
  int write_outputs(const scaling_fits& fits) {
    int failed = 0;
    auto check = [&](const std::string& e) {
      if (e.empty()) return;
      if (write_warnings.insert(e).second) say("warning: {}", e);  // said once, not after every point
      ++failed;
    };
    for (const auto& e : write_results(s, results)) check(e);
    if (s.fit.enabled) check(write_atomically((fs::path(s.out_dir) / "fit.json").string(), fits_json(fits)));
    check(write_atomically((fs::path(s.out_dir) / "sweep.html").string(), sweep_page(s, results, fits)));
    return failed;
  }
  void write_outputs() { write_outputs(fit_scaling(s, results)); }

  /// Starts over when asked, or when the folder's run is not this point's (other settings, or no record).
  bool starts_over(const sweep_point& p) const {
    return o.fresh || results[p.index].status == "stale" ||
           (results[p.index].status == "pending" && has_checkpoints(p));
  }

  /// Before anything runs (the out_dir locked): a folder that holds a run of other settings, or one the sweep
  /// has no record of, moves to superseded/ (kept, not replaced); a point without a folder takes back a run
  /// of its settings found under another id or in superseded/. With `apply` false only counts what would.
  size_t tidy_folders(bool apply) {
    auto unclaimed = unclaimed_runs(s);
    std::vector<const sweep_point*> left;
    size_t taken = 0, discarded = 0;
    for (const auto* p : to_run) {
      auto& r = results[p->index];
      std::error_code ec;
      // --fresh: every earlier run is moved aside at once, not as its point starts, so that an interrupted
      // --fresh sweep resumes with them as --fresh left them (it took a finished one as done again).
      if (apply && o.fresh && fs::exists(p->out_dir, ec) && folder_in_use(p->out_dir).empty() &&
          !set_aside(s, *p, fresh_dir).empty())
        ++discarded;
      if (apply && !o.fresh && starts_over(*p) && folder_in_use(p->out_dir).empty()) {
        const auto to = set_aside(s, *p);
        if (!to.empty()) {
          say("{}: its folder held a run of other settings or without a record; moved to {}", point_name(*p),
              to);
          r = point_result{};
        }
      }
      auto it = unclaimed.end();
      for (const auto& f : config_fingerprints(*p))
        if (it == unclaimed.end()) it = unclaimed.find(f);
      if (o.fresh || r.status != "pending" || fs::exists(p->out_dir, ec) || it == unclaimed.end()) {
        left.push_back(p);
        continue;
      }
      ++taken;
      if (!apply) continue;
      fs::create_directories(fs::path(p->out_dir).parent_path(), ec);
      fs::rename(it->second, p->out_dir, ec);
      if (ec) {
        left.push_back(p);
        continue;
      }
      say("{}: takes back the run of the same settings in {}", point_name(*p), it->second);
      unclaimed.erase(it);
      r = recorded(*p);
      r.log = (fs::path(p->out_dir) / "log.txt").string();
      if (r.status == "done")
        note_unread(*p, read_run(p->out_dir, r));
      else
        left.push_back(p);
    }
    if (apply) to_run = std::move(left);
    if (discarded > 0)
      say("--fresh: moved the {} earlier run{} to {}/{} (kept; delete it to free the space)", discarded,
          discarded == 1 ? "" : "s", s.out_dir, fresh_dir);
    return taken;
  }

  bool can_start(const sweep_point& p) const {
    if (active.empty()) return true;
    if (static_cast<int64_t>(active.size()) >= plan.limit) return false;
    return !plan.pack_by_threads || used_threads + p.thread_need() <= static_cast<int64_t>(plan.cores);
  }

  void start_next() {
    while (!stopping && next < to_run.size() && can_start(*to_run[next])) {
      const auto& p = *to_run[next++];
      // Its folder belongs to a live run: left alone, record and all (the run refused it with exit 4, and
      // the sweep wrote "failed" over the record of a run it did not start).
      if (const auto pid = folder_in_use(p.out_dir); !pid.empty()) {
        results[p.index].status = "in use";
        ++finished_now;
        say("{}: its folder is in use by another longwave run (pid {}: left running or stopped by an earlier "
            "sweep?); not started, its record left as it is",
            point_name(p), pid);
        write_outputs();
        continue;
      }
      running r;
      r.point = p.index;
      r.need = p.thread_need();
      r.started = steady::now();
      const bool fresh = starts_over(p);
      std::error_code ec;
      // A run that held the folder when the sweep planned (tidy_folders left it) and has ended since moves
      // aside now, as planned: the point's --fresh would delete it.
      if (fresh && fs::exists(p.out_dir, ec)) {
        const auto to = set_aside(s, p, o.fresh ? fresh_dir : "superseded");
        if (to.empty()) {
          results[p.index].status = "failed";
          ++finished_now;
          say("{}: its folder {} holds a run of other settings that could not be moved aside; not started, "
              "so as not to delete it (move it yourself, then run the sweep again)",
              point_name(p), p.out_dir);
          write_outputs();
          continue;
        }
        say("{}: its folder held a run of other settings (in use when the sweep began); moved to {}",
            point_name(p), to);
      }
      results[p.index] = point_result{};
      results[p.index].status = "running";
      fs::create_directories(p.out_dir, ec);    // start_point reports a failure to make it
      write_point_record(p, results[p.index]);  // a crash from here on leaves "running": it resumes
      r.pid = start_point(s, p, o, plan.threads_for(p), fresh);
      active.push_back(r);
      used_threads += r.need;
      results[p.index].log = (fs::path(p.out_dir) / "log.txt").string();
      say("{} started; log: {}", point_name(p), results[p.index].log);
      write_outputs();
    }
  }

  void on_exit(const running& r, int code, bool by_signal) {
    const auto& p = s.points[r.point];
    auto& res = results[r.point];
    res = point_result{};
    res.log = (fs::path(p.out_dir) / "log.txt").string();
    res.exit_code = code;
    const auto unread = read_run(p.out_dir, res);
    if (code == 0) note_unread(p, unread);
    const double took = seconds_since(r.started);
    const bool signalled =
        code == 130 || code == 128 + SIGINT || code == 128 + SIGKILL || code == 128 + SIGTERM;
    res.status = code == 0 ? "done" : stopping && signalled ? "interrupted" : "failed";
    write_point_record(p, res);
    ++finished_now;
    if (res.status == "done") ++done_now;
    if (res.status == "done") {
      say("{} done in {}, val loss {}; {}/{} done{}", point_name(p), report::duration_text(took),
          report::fixed(res.val_loss, 4), n_done(), s.points.size(), eta());
    } else if (res.status == "interrupted") {
      say("{} stopped (exit {}); it resumes from its checkpoint next time", point_name(p), code);
    } else {
      say("{} FAILED: {} after {}; log: {} (last line: {})", point_name(p),
          by_signal ? fmt::format("killed by signal {} ({})", code - 128, strsignal(code - 128))
                    : fmt::format("exit code {}", code),
          report::duration_text(took), res.log, log_tail(res.log).first);
    }
    write_outputs();
  }

  void reap() {
    for (size_t i = 0; i < active.size();) {
      int status = 0;
      if (waitpid(active[i].pid, &status, WNOHANG) != active[i].pid) {
        ++i;
        continue;
      }
      const running r = active[i];
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      used_threads -= r.need;
      on_exit(r, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), WIFSIGNALED(status));
    }
  }

  void forward_signals() {
    const int sigs = g_signals.load();
    if (sigs <= handled_signals) return;
    handled_signals = sigs;
    stopping = true;  // two signals within one tick skip the first branch: they stop the sweep all the same
    if (sigs == 1 && active.empty()) {
      say("interrupt: no point is running; the sweep stops here");
    } else if (sigs == 1) {
      say("interrupt: stopping {} running point(s); each saves a checkpoint (Ctrl-C again to kill them)",
          active.size());
      for (const auto& r : active) kill(r.pid, SIGINT);
      last_heartbeat = steady::now() - std::chrono::seconds(50);  // who it waits for, 10 s from now
    } else {
      say("second interrupt: killing the running points (they resume from their last checkpoint)");
      for (const auto& r : active) kill(r.pid, SIGKILL);
    }
  }

  /// Once a minute while points run: each one's time and last progress line, "stopped" for one in state T
  /// (SIGSTOP, Ctrl-Z: it makes no progress until continued), and the ETA; while the sweep is stopping, which
  /// points it still waits for.
  void heartbeat() {
    if (seconds_since(last_heartbeat) < 60 || active.empty()) return;
    last_heartbeat = steady::now();
    std::string now;
    for (const auto& r : active) {
      const auto& p = s.points[r.point];
      const auto progress = log_tail((fs::path(p.out_dir) / "log.txt").string()).second;
      now += fmt::format("{}{} {}{}{}", now.empty() ? "" : "; ", point_name(p),
                         report::duration_text(seconds_since(r.started)),
                         progress.empty() ? " [starting]" : " [" + progress + "]",
                         runtime::is_stopped(r.pid)
                             ? fmt::format(", STOPPED by a signal: no progress until `kill -CONT {}`", r.pid)
                             : "");
    }
    if (stopping) {
      say("stopping: waiting for {} to save {} checkpoint{}: {}", active.size() == 1 ? "a point" : "points",
          active.size() == 1 ? "its" : "their", active.size() == 1 ? "" : "s", now);
      return;
    }
    say("{}/{} done; running: {}{}", n_done(), s.points.size(), now, eta());
  }

  void loop() {
    for (;;) {
      forward_signals();
      start_next();
      if (active.empty() && (stopping || next >= to_run.size())) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      reap();
      heartbeat();
    }
  }
};

void print_plan(const sweep_spec& s, const sweep_run& run) {
  say("{}: {} point{} ({} done earlier, {} to run); base {}; out_dir {}", s.path, s.points.size(),
      s.points.size() == 1 ? "" : "s", s.points.size() - run.to_run.size(), run.to_run.size(), s.base,
      s.out_dir);
  // A folder a live run holds is not started, nor moved (a probe: the plan said it would start over).
  const auto over = std::count_if(run.to_run.begin(), run.to_run.end(), [&](const sweep_point* p) {
    return !run.o.fresh && run.starts_over(*p) && folder_in_use(p->out_dir).empty();
  });
  if (over > 0)
    say("{} of them start over: their folders hold runs of other settings, another base config or no record "
        "of this sweep, which move to {}/superseded/",
        over, s.out_dir);
  for (const auto& w : s.warnings) say("warning: {}", w);
  // Runs set aside (superseded/ID, superseded/fresh-TIME/ID) are kept for good: say what they hold.
  std::error_code ec;
  const fs::path aside = fs::path(s.out_dir) / "superseded";
  size_t runs = 0;
  for (fs::directory_iterator it(aside, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    if (it->path().filename().string().rfind("fresh-", 0) != 0) {
      ++runs;
      continue;
    }
    std::error_code inner;
    for (fs::directory_iterator run_dir(it->path(), inner), stop; !inner && run_dir != stop;
         run_dir.increment(inner))
      runs += run_dir->is_directory(inner);
  }
  uintmax_t bytes = 0;
  for (fs::recursive_directory_iterator it(aside, ec), end; runs > 0 && !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) bytes += it->file_size(ec);
  if (runs > 0)
    say("{}/ keeps {} earlier run{} ({:.1f} MiB), which no sweep removes: delete what you no longer want",
        aside.string(), runs, runs == 1 ? "" : "s", static_cast<double>(bytes) / (1 << 20));
  say("{}", run.plan.text);
}

}  // namespace

int run_sweep(sweep_spec& s, const sweep_options& o) {
  if (o.parallel >= 0) s.parallel = o.parallel;
  sweep_run run(s, o);
  for (const auto& p : s.points) {
    auto& r = run.results[p.index];
    if (!o.fresh) r = recorded(p);
    r.log = (fs::path(p.out_dir) / "log.txt").string();
    // A stale folder's run is of other settings: its numbers are not this point's (a probe saw them).
    if (r.status == "done" || (o.results_only && r.status != "pending" && r.status != "stale")) {
      const auto unread = read_run(p.out_dir, r);
      if (r.status == "done") run.note_unread(p, unread);
    }
    if (r.status != "done") run.to_run.push_back(&p);
  }
  run.plan = plan_parallel(s.parallel, runtime::usable_cores(), run.to_run);
  if (const auto clash = run.shared_metrics_port(); !clash.empty()) {
    say("error: {}", clash);
    return 2;
  }
  if (o.dry_run) {
    print_plan(s, run);
    if (o.fresh) {
      std::error_code ec;
      const auto moving = std::count_if(run.to_run.begin(), run.to_run.end(), [&](const sweep_point* p) {
        return fs::exists(p->out_dir, ec) && folder_in_use(p->out_dir).empty();
      });
      if (moving > 0)
        say("--fresh: {} earlier run{} would move to {}/superseded/fresh-<UTC time>/ (kept)", moving,
            moving == 1 ? "" : "s", s.out_dir);
    }
    if (const size_t taken = run.tidy_folders(false))
      say("{} of them take back a run of the same settings found under another id (moved when the sweep "
          "runs)",
          taken);
    for (const auto& p : s.points)
      fmt::print("  {:>3}/{} {} [{}]\n", p.index + 1, s.points.size(), p.id,
                 p.label(s.has_repeats).empty() ? "base config" : p.label(s.has_repeats));
    // As the sweep would start it: a folder to start over is moved aside first (tidy_folders), so only
    // --fresh adds --fresh.
    if (!s.points.empty()) {
      const auto& first = s.points.front();
      std::string cmd;
      for (const auto& w : point_command(s, first, o, run.plan.threads_for(first), o.fresh))
        cmd += (cmd.empty() ? "" : " ") + shell_word(w);
      fmt::print("point 1 runs: {}\n", cmd);
    }
    return 0;
  }
  std::error_code ec;
  fs::create_directories(s.out_dir, ec);
  if (ec) {
    say("error: cannot make {}: {}", s.out_dir, ec.message());
    return 1;
  }
  std::string why;
  const int lock = lock_out_dir(s.out_dir, &why);
  if (lock < 0) {
    say("error: {}", why);
    return lock == -1 ? 4 : 1;
  }
  if (o.results_only) {
    // No sweep runs (this one holds its lock): a point recorded running whose folder no run holds was cut
    // off with its sweep (a SIGKILL, a crash).
    for (const auto& p : s.points)
      if (run.results[p.index].status == "running" && folder_in_use(p.out_dir).empty())
        run.results[p.index].status = "interrupted";
    const auto fits = fit_scaling(s, run.results);
    const int unwritten = run.write_outputs(fits);
    for (const auto& line : fit_lines(fits)) fmt::print("{}\n", line);
    // Exit 0 once written, whatever the points' status, which the line and the table give.
    std::map<std::string, size_t> others;
    for (const auto& r : run.results)
      if (r.status != "done") ++others[r.status];
    std::string rest;
    for (const auto& [status, n] : others) rest += fmt::format(", {} {}", n, status);
    if (unwritten == 0)
      say("wrote {}/results.csv, results.jsonl and sweep.html ({} of {} points done{})", s.out_dir,
          run.n_done(), s.points.size(), rest);
    else
      say("error: {} of the sweep's output files could not be written (above)", unwritten);
    close(lock);
    return unwritten == 0 ? 0 : 1;
  }
  run.tidy_folders(true);
  run.plan = plan_parallel(s.parallel, runtime::usable_cores(), run.to_run);
  print_plan(s, run);
  g_signals = 0;
  runtime::count_stop_signals(g_signals);
  int code = 0;
  try {
    run.write_outputs();
    run.loop();
  } catch (const std::exception& e) {
    say("error: {}; stopping the running points", e.what());
    for (const auto& r : run.active) kill(r.pid, SIGINT);
    for (const auto& r : run.active) waitpid(r.pid, nullptr, 0);
    code = 1;
  }
  runtime::uncount_stop_signals();
  const auto fits = fit_scaling(s, run.results);
  const int unwritten = run.write_outputs(fits);
  if (unwritten > 0) {
    say("error: {} of the sweep's output files could not be written (above); the points' own folders hold "
        "their results",
        unwritten);
    code = 1;
  }
  const size_t done = run.n_done();
  if (run.stopping) {
    say("interrupted: {} of {} points done; run the same command {} to resume (finished points are skipped, "
        "interrupted ones resume from their checkpoints)",
        done, s.points.size(), o.fresh ? "without --fresh (which starts every point over)" : "again");
    close(lock);
    return 130;
  }
  for (const auto& line : fit_lines(fits)) fmt::print("{}\n", line);
  std::string failed;
  size_t n_failed = 0;
  for (size_t i = 0; i < s.points.size(); ++i)
    if (run.results[i].status == "failed" && ++n_failed)
      failed +=
          fmt::format("{}  point {} {}: {}, log {}", failed.empty() ? "" : "\n", i + 1, s.points[i].id,
                      run.results[i].exit_code >= 0 ? fmt::format("exit code {}", run.results[i].exit_code)
                                                    : std::string("it did not start"),
                      run.results[i].log);
    else if (run.results[i].status == "in use" && ++n_failed)
      failed += fmt::format("{}  point {} {}: its folder is in use by another run",
                            failed.empty() ? "" : "\n", i + 1, s.points[i].id);
  if (unwritten == 0)
    say("finished: {} of {} points done in {}; results: {}/results.csv (and .jsonl), page: {}/sweep.html",
        done, s.points.size(), report::duration_text(seconds_since(run.t0)), s.out_dir, s.out_dir);
  else
    say("finished: {} of {} points done in {}", done, s.points.size(),
        report::duration_text(seconds_since(run.t0)));
  if (!failed.empty()) {
    say("{} point(s) failed (they run again next time):\n{}", n_failed, failed);
    code = 1;
  }
  close(lock);
  return code;
}

}  // namespace longwave::cli::sweep
