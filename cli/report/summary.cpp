// Per-node and whole-run summaries of the report.
#include "cli/report/summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "cli/report/format.hpp"

namespace longwave::cli::report {
namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// The final evaluation: the end record of the last session if there is one, else the last eval.
void find_final_validation(const node_metrics& m, const record* last_end, node_summary& s) {
  if (!m.evals.empty())
    s.final_val_loss = num(m.evals.back(), "val_loss"), s.final_val_ppl = num(m.evals.back(), "val_ppl");
  if (last_end && std::isfinite(num(*last_end, "val_ppl")))
    s.final_val_loss = num(*last_end, "val_loss"), s.final_val_ppl = num(*last_end, "val_ppl");
  if (!std::isfinite(s.final_val_ppl) && std::isfinite(s.final_val_loss))
    s.final_val_ppl = std::exp(s.final_val_loss);
}

// Utilization (compute / wall time, else the mean of the recorded figures) and stall seconds.
void sum_workers(const node_metrics& m, node_summary& s) {
  double compute = 0, wall = 0, util_sum = 0;
  size_t n_util = 0;
  for (const auto& w : m.workers) {
    const double cs = num(w, "compute_s"), ws = num(w, "wall_s"), u = num(w, "utilization"),
                 st = num(w, "stall_s");
    if (std::isfinite(cs) && std::isfinite(ws)) compute += cs, wall += ws;
    if (std::isfinite(u)) util_sum += u, ++n_util;
    if (std::isfinite(st)) s.stall_s += st;
  }
  s.utilization = wall > 0 ? compute / wall : n_util ? util_sum / static_cast<double>(n_util) : nan;
}

std::string status_of(const record* last_end) {
  if (!last_end) return "no end record (still running, or killed)";
  const double code = num(*last_end, "exit_code");
  if (const auto by = text(*last_end, "stopped_by"); code == 130 && !by.empty())
    return "stopped at a round boundary (" + by + ")";
  return code == 0     ? "completed"
         : code == 130 ? "interrupted (Ctrl-C)"
                       : fmt::format("failed (exit {})", compact(code));
}

// diloco.outer = "async": the node's phases, and what the merges took of them (a version redone after a
// resume counts once, as its last record says).
void sum_async(const node_metrics& m, node_summary& s) {
  double rate_sum = 0;
  for (const auto& c : m.contributions) {
    s.async_phases += 1;
    if (const double t = num(c, "tokens"); std::isfinite(t)) s.async_trained_tokens += t;
    if (const double r = num(c, "steps_per_second"); std::isfinite(r)) rate_sum += r;
  }
  if (s.async_phases > 0) s.async_steps_per_s = rate_sum / s.async_phases;
  std::map<double, const record*> by_version;
  for (const auto& v : m.versions) by_version[num(v, "version")] = &v;
  double stale_sum = 0, merged = 0;
  for (const auto& [version, v] : by_version) {
    const double own = num(*v, "own_staleness");
    if (!std::isfinite(own)) continue;
    merged += 1, stale_sum += own;
    s.async_max_staleness = std::isfinite(s.async_max_staleness) ? std::max(s.async_max_staleness, own) : own;
    if (const double t = num(*v, "own_tokens"); std::isfinite(t)) s.async_merged_tokens += t;
  }
  if (merged > 0) s.async_mean_staleness = stale_sum / merged;
  s.async_dropped = static_cast<double>(m.drops.size());
}

}  // namespace

void find_time_span(report_data& r) {
  double first_start = HUGE_VAL, first_any = HUGE_VAL, last = -HUGE_VAL;
  for (const auto& m : r.nodes) {
    if (!m.starts.empty() && std::isfinite(num(m.starts.front(), "ts")))
      first_start = std::min(first_start, num(m.starts.front(), "ts"));
    for (const auto& [a, b] : m.sessions) {
      if (std::isfinite(a)) first_any = std::min(first_any, a);
      if (std::isfinite(b)) last = std::max(last, b);
    }
  }
  r.t0 = std::isfinite(first_start) ? first_start : std::isfinite(first_any) ? first_any : nan;
  r.t_last = std::isfinite(last) ? last : nan;
}

node_summary summarize(const node_metrics& m) {
  node_summary s;
  const record* last_end = m.ended ? &m.ends.back() : nullptr;
  find_final_validation(m, last_end, s);
  sum_workers(m, s);
  sum_async(m, s);
  for (const auto& st : m.steps)
    s.last_step = std::isfinite(s.last_step) ? std::max(s.last_step, st.step) : st.step;
  double ar_sum = 0, wait_sum = 0;
  size_t n_ar = 0;
  for (const auto& a : m.allreduces) {
    if (const double x = num(a, "seconds"); std::isfinite(x)) ar_sum += x, ++n_ar;
    if (const double w = num(a, "send_wait_seconds"); std::isfinite(w))
      wait_sum += w, s.next_node = text(a, "next");
  }
  if (n_ar) s.allreduce_mean_s = ar_sum / static_cast<double>(n_ar);
  if (!s.next_node.empty() && ar_sum > 0) s.send_wait_share = wait_sum / ar_sum;
  for (const auto& [first, last] : m.sessions)
    if (std::isfinite(first) && std::isfinite(last)) s.active_s += last - first;
  s.status = status_of(last_end);
  return s;
}

namespace {

// The GPU workers' figures (records without gpu_busy_s are CPU workers').
void sum_gpus(const report_data& r, run_summary& t) {
  double busy = 0, wall = 0, peak = 0, mfu_sum = 0;
  size_t n_gpu = 0, n_mfu = 0;
  for (const auto& m : r.nodes) {
    std::map<double, double> last_mfu;  // worker -> its last round's figure
    for (const auto& w : m.workers) {
      const double b = num(w, "gpu_busy_s");
      if (!std::isfinite(b)) continue;
      ++n_gpu;
      busy += b;
      if (std::isfinite(num(w, "wall_s"))) wall += num(w, "wall_s");
      if (std::isfinite(num(w, "gpu_memory_peak_bytes")))
        peak = std::max(peak, num(w, "gpu_memory_peak_bytes"));
      if (std::isfinite(num(w, "mfu"))) last_mfu[num(w, "worker")] = num(w, "mfu");
    }
    for (const auto& [worker, x] : last_mfu) mfu_sum += x, ++n_mfu;
  }
  if (n_gpu == 0) return;
  t.gpu_utilization = wall > 0 ? busy / wall : nan;
  t.gpu_peak_bytes = peak;
  if (n_mfu) t.mfu = mfu_sum / static_cast<double>(n_mfu);
}

/// A cluster's end as its coordinator recorded it (outcome, removed "c:lost,d:left"): the run's status, and
/// "removed (lost)" for a node that has no end record of its own.
void apply_cluster_end(const report_data& r, const record& end, run_summary& t) {
  std::map<std::string, std::string> removed;  // node -> why
  std::string removed_text;
  std::istringstream list(text(end, "removed"));
  for (std::string item; std::getline(list, item, ',');) {
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon),
                      why = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (!name.empty()) {
      removed[name] = why;
      removed_text += (removed_text.empty() ? "" : ", ") + name + (why.empty() ? "" : " (" + why + ")");
    }
  }
  for (size_t i = 0; i < r.nodes.size(); ++i)  // a node's folder is its name in the cluster file
    if (const auto it =
            removed.find(std::filesystem::path(r.nodes[i].path).parent_path().filename().string());
        it != removed.end() && !r.nodes[i].ended)
      t.nodes[i].status = it->second.empty() ? "removed" : "removed (" + it->second + ")";
  const std::string outcome = text(end, "outcome");
  std::string status = outcome == "finished"      ? "completed"
                       : outcome == "stopped"     ? "stopped (longwave stop)"
                       : outcome == "interrupted" ? "interrupted (Ctrl-C)"
                                                  : outcome;
  std::replace(status.begin(), status.end(), '_', ' ');
  if (const double code = num(end, "exit_code"); std::isfinite(code) && code != 0 && code != 130)
    status += fmt::format(" (coordinator exit {})", compact(code));
  if (!removed_text.empty()) status += "; removed on the way: " + removed_text;
  if (!status.empty()) t.status = status;
}

}  // namespace

run_summary summarize_run(const report_data& r) {
  run_summary t;
  sum_gpus(r, t);
  double compute = 0, wall = 0;
  for (const auto& m : r.nodes) {
    t.nodes.push_back(summarize(m));
    t.bytes += m.bytes_sent;
    t.sessions = std::max(t.sessions, m.starts.size());
    t.min_sessions = t.nodes.size() == 1 ? m.starts.size() : std::min(t.min_sessions, m.starts.size());
    t.n_checkpoints += m.checkpoints.size();
    t.active_s = std::max(t.active_s, t.nodes.back().active_s);
    t.stall_s += t.nodes.back().stall_s;
    if (!m.starts.empty()) t.workers += num(m.starts.front(), "workers");
    for (const auto& w : m.workers)
      if (std::isfinite(num(w, "compute_s")) && std::isfinite(num(w, "wall_s")))
        compute += num(w, "compute_s"), wall += num(w, "wall_s");
  }
  t.overall = t.nodes.front();
  for (const auto& s : t.nodes)
    if (std::isfinite(s.final_val_ppl)) {
      t.overall.final_val_ppl = s.final_val_ppl, t.overall.final_val_loss = s.final_val_loss;
      break;
    }
  t.utilization = wall > 0 ? compute / wall : nan;
  if (!std::isfinite(t.utilization)) {  // no compute/wall split recorded: mean of the per-node figures
    double sum = 0, n = 0;
    for (const auto& s : t.nodes)
      if (std::isfinite(s.utilization)) sum += s.utilization, ++n;
    if (n > 0) t.utilization = sum / n;
  }
  // On a ring only the node before a slow link waits to send: the largest such share names the link.
  const node_summary* slow = nullptr;
  for (const auto& s : t.nodes)
    if (std::isfinite(s.send_wait_share) && s.send_wait_share >= 0.25 &&
        (!slow || s.send_wait_share > slow->send_wait_share))
      slow = &s;
  if (slow) {
    const auto& name = r.nodes[static_cast<size_t>(slow - t.nodes.data())].name;
    t.slowest_link = fmt::format("{} -> {} ({:.0f} % of {}'s all-reduce time waiting to send)", name,
                                 slow->next_node, 100 * slow->send_wait_share, name);
  }
  t.status = t.nodes.front().status;
  for (const auto& s : t.nodes)
    if (s.status != "completed") t.status = s.status;
  if (r.coordinator && r.coordinator->ended) apply_cluster_end(r, r.coordinator->ends.back(), t);
  return t;
}

}  // namespace longwave::cli::report
