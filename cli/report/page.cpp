// The report page: the HTML around the summary, the tables and the charts, written from RUN_DIR's
// metrics.jsonl files.
#include "cli/report/page.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/report/charts.hpp"
#include "cli/report/format.hpp"
#include "cli/report/records.hpp"
#include "cli/report/run_charts.hpp"
#include "cli/report/summary.hpp"
#include "runtime/files/atomic_file.hpp"

namespace longwave::cli::report {
namespace {

namespace fs = std::filesystem;

const char* const css = R"(
:root { color-scheme: light; }
body { margin: 0; background: #f5f6f8; color: #1f2937;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 40px; }
h1 { font-size: 22px; font-weight: 650; margin: 0 0 2px; }
h2 { font-size: 16px; font-weight: 600; margin: 26px 0 10px; }
.sub { color: #6b7280; margin: 0 0 18px; overflow-wrap: anywhere; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px; }
.card, table, figure, .empty { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; }
.card { padding: 10px 14px; }
.card .k { color: #6b7280; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.tables { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; align-items: start; }
table { border-collapse: separate; border-spacing: 0; width: 100%; overflow: hidden; }
th, td { text-align: left; padding: 5px 12px; border-bottom: 1px solid #f0f1f3; vertical-align: top; }
tr:last-child td { border-bottom: none; }
thead th { background: #f9fafb; font-weight: 600; }
tbody th { color: #4b5563; font-weight: 500; }
table.kv tbody th { width: 42%; }
td { font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.ok { color: #15803d; } .warn { color: #b45309; }
.charts { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 16px; }
figure { margin: 0; padding: 10px 8px 4px; }
svg.chart { display: block; width: 100%; height: auto; }
.chart text { font-family: inherit; font-size: 11px; fill: #4b5563; }
.chart .title { font-size: 14px; font-weight: 600; fill: #111827; }
.chart .label { font-size: 12px; fill: #374151; }
.chart .resume text { font-size: 10px; fill: #6b7280; }
.chart .legend text { font-size: 11.5px; fill: #374151; }
.empty { padding: 16px; color: #6b7280; }
.empty b { color: #111827; display: block; margin-bottom: 4px; }
footer { color: #6b7280; font-size: 12px; margin-top: 28px; overflow-wrap: anywhere; }
@media (max-width: 900px) { .charts, .tables { grid-template-columns: 1fr; } }
)";

/// Table rows: (label, value); values are escaped here.
std::string table(const std::string& caption, const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string o = fmt::format(
      "<table class=\"kv\"><thead><tr><th colspan=\"2\">{}</th></tr></thead><tbody>\n", html_escape(caption));
  for (const auto& [k, v] : rows)
    o += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", html_escape(k), html_escape(v));
  return o + "</tbody></table>\n";
}

/// The run's settings as the first node's last start line recorded them, its latest session's (train.rounds
/// may grow, and a resume may change lr); "–" where it did not.
struct start_fields {
  const record& cfg;
  std::string operator()(const char* key) const {
    const auto* f = cfg.find(key);
    if (!f) return std::string("–");
    return f->text != record::no_text ? cfg.texts[f->text] : compact(f->num);
  }
};

std::string page_head(const report_data& r, const start_fields& field, const std::string& status) {
  const bool cluster = r.nodes.size() > 1;
  const auto& first = r.nodes.front();
  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  // The title names what the heading names (a probe: they differed).
  const auto name = html_escape(cluster ? fs::path(r.run_dir).filename().string() : first.name);
  o += fmt::format("<title>Longwave report: {}</title>\n", name);
  o += fmt::format("<style>{}</style>\n</head>\n<body>\n<main>\n", page_css());
  o += fmt::format("<h1>Longwave run report: {}</h1>\n", name);
  o += fmt::format(
      "<p class=\"sub\">{} &middot; {} {} &middot; started {} &middot; {}</p>\n", html_escape(r.run_dir),
      html_escape(field("mode")),
      cluster ? fmt::format("&middot; {} {}", r.nodes.size(),
                            r.separate_runs ? "separate runs, not one cluster's nodes (the totals add "
                                              "them up)"
                                            : "nodes")
              : "",
      utc_text(r.t0), html_escape(status));
  return o;
}

std::string utilization_text(double util) {
  return std::isfinite(util) ? fixed(util * 100, 1) + " %" : "–";
}

// Headline numbers. ppl_of: whose perplexity it is where the folder holds separate runs ("": the run's).
std::string headline_cards(const run_summary& sum, double total_s, const std::string& ppl_of) {
  auto card = [](const std::string& k, const std::string& v, const char* cls = "") {
    return fmt::format("<div class=\"card\"><div class=\"k\">{}</div><div class=\"v {}\">{}</div></div>\n", k,
                       cls, html_escape(v));
  };
  std::string o = "<section class=\"cards\">\n";
  o += card(
      ppl_of.empty() ? std::string("final val perplexity") : "final val perplexity of " + html_escape(ppl_of),
      fixed(sum.overall.final_val_ppl, 3));
  o += card("total time", duration_text(total_s));
  o += card("avg utilization", utilization_text(sum.utilization));
  o += card("bytes sent", bytes_short(sum.bytes));
  o += card("status", sum.status, sum.status == "completed" ? "ok" : "warn");
  return o + "</section>\n";
}

std::string configuration_table(bool cluster, const run_summary& sum, const start_fields& field) {
  const double params = num(field.cfg, "params");
  return table(
      "Configuration",
      {{"mode", field("mode")},
       {"model preset", field("preset")},
       {"parameters",
        std::isfinite(params) ? fmt::format("{:.2f} M ({})", params / 1e6, with_commas(params)) : "–"},
       {cluster ? "workers (all nodes)" : "workers", cluster ? compact(sum.workers) : field("workers")},
       {"outer rounds", field("rounds")},
       {"inner steps per round (H)", field("inner_steps")},
       {"batch size × sequence length", field("batch_size") + " × " + field("seq_len")},
       {"inner learning rate (AdamW)", field("inner_lr")},
       {"outer learning rate / momentum", field("outer_lr") + " / " + field("outer_momentum")},
       {"all-reduce dtype", field("comm_dtype")}});
}

// Where a node's rounds (2 on) waited, the mean a round: for the all-reduce, and for the outer step. "–" for
// files written before round records said so.
std::string round_wait_text(const node_metrics& m) {
  if (m.timed_rounds == 0) return "–";
  const auto n = static_cast<double>(m.timed_rounds);
  return fmt::format("{} s, {} s", fixed(m.reducing_s / n, 3), fixed(m.outer_step_s / n, 3));
}

std::string outcome_table(const report_data& r, const run_summary& sum, const start_fields& field) {
  // The session's planned end (another H after a resume moves it); rounds × H in files without it.
  const double planned = num(field.cfg, "planned_steps");
  const double total =
      std::isfinite(planned) ? planned : num(field.cfg, "rounds") * num(field.cfg, "inner_steps");
  const double total_s = r.t_last - r.t0, last_step = sum.overall.last_step;
  const size_t sessions = sum.sessions;
  const bool async = std::any_of(r.nodes.begin(), r.nodes.end(),
                                 [](const node_metrics& m) { return !m.contributions.empty(); });
  auto rows = std::vector<std::pair<std::string, std::string>>{
      {"status", sum.status},
      {"started", utc_text(r.t0)},
      {"total time (first start to last record)", duration_text(total_s)},
      {"training time (sum of sessions)", duration_text(sum.active_s)},
      {"sessions", sum.min_sessions < sessions
                       ? fmt::format("{} to {} per node (a node restarted alone: the Nodes table says which)",
                                     sum.min_sessions, sessions)
                   : sessions > 1 ? fmt::format("{} (resumed {})", sessions,
                                                sessions == 2 ? std::string("once")
                                                              : fmt::format("{} times", sessions - 1))
                                  : compact(double(sessions))},
      {"inner steps per worker",
       // async: train.rounds counts the versions the merges make, not any node's rounds
       std::isfinite(total) && !async ? fmt::format("{} of {}", compact(last_step), compact(total))
                                      : compact(last_step)},
      {"final val loss", fixed(sum.overall.final_val_loss, 4)},
      {"final val perplexity", fixed(sum.overall.final_val_ppl, 3)},
      {"average compute utilization", utilization_text(sum.utilization)},
      {"stall seconds (all workers)", fixed(sum.stall_s, 2)},
      {"total bytes sent", bytes_text(sum.bytes)},
      {"checkpoints written", compact(double(sum.n_checkpoints))}};
  if (!sum.slowest_link.empty()) rows.push_back({"slowest ring link", sum.slowest_link});
  if (r.nodes.size() == 1 && r.nodes.front().timed_rounds > 0)  // a cluster's Nodes table has it per node
    rows.push_back({"a round's wait (round 2 on): all-reduce, outer step", round_wait_text(r.nodes.front())});
  if (std::isfinite(sum.gpu_utilization) || std::isfinite(sum.gpu_peak_bytes)) {  // workers on GPUs
    rows.push_back({"GPU busy / wall time (GPU workers)", utilization_text(sum.gpu_utilization)});
    rows.push_back({"peak GPU memory (one GPU)", bytes_text(sum.gpu_peak_bytes)});
    rows.push_back({"model FLOP/s utilization (6N, no attention)", utilization_text(sum.mfu)});
  }
  return table("Outcome", rows);
}

// A node's step counter, and the steps it trained itself when fewer (a joiner fetched the others' state).
std::string steps_text(const node_metrics& m, const node_summary& s) {
  const auto trained = static_cast<double>(m.steps.size());
  if (!std::isfinite(s.last_step) || trained >= s.last_step) return compact(s.last_step);
  return fmt::format("{} ({} trained here)", compact(s.last_step), compact(trained));
}

// A cluster's row per node.
std::string nodes_table(const report_data& r, const run_summary& sum) {
  std::string o =
      "<h2>Nodes</h2>\n<table><thead><tr><th>node</th><th>workers</th><th>sessions</th><th>inner steps</th>"
      "<th>final val ppl</th><th>utilization</th><th>mean all-reduce</th>"
      "<th>a round's wait: all-reduce, outer step</th>"
      "<th>bytes sent</th><th>status</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    const auto& m = r.nodes[i];
    const auto& s = sum.nodes[i];
    o += fmt::format(
        "<tr><th><span style=\"color:{}\">&#9632;</span> "
        "{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
        color(i), html_escape(m.name), m.starts.empty() ? "–" : compact(num(m.starts.front(), "workers")),
        m.starts.size(), steps_text(m, s), fixed(s.final_val_ppl, 3), utilization_text(s.utilization),
        std::isfinite(s.allreduce_mean_s) ? fixed(s.allreduce_mean_s, 3) + " s" : "–", round_wait_text(m),
        html_escape(bytes_short(m.bytes_sent)), html_escape(s.status));
  }
  return o + "</tbody></table>\n";
}

// diloco.outer = "async": per node, its phases and step rate, the share of its trained tokens the merges took
// (goodput), merged tokens per second of its active time, and its contributions' staleness and drops.
std::string async_table(const report_data& r, const run_summary& sum) {
  std::string rows;
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    const auto& s = sum.nodes[i];
    if (s.async_phases == 0) continue;
    const double share =
        s.async_trained_tokens > 0 ? s.async_merged_tokens / s.async_trained_tokens : HUGE_VAL;
    rows += fmt::format(
        "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td></tr>\n",
        html_escape(r.nodes[i].name), compact(s.async_phases), fixed(s.async_steps_per_s, 2),
        with_commas(s.async_trained_tokens), with_commas(s.async_merged_tokens),
        std::isfinite(share) ? fmt::format("{:.0f} %", 100 * share) : std::string("–"),
        s.active_s > 0 ? with_commas(s.async_merged_tokens / s.active_s) : std::string("–"),
        fixed(s.async_mean_staleness, 2), compact(s.async_max_staleness), compact(s.async_dropped));
  }
  if (rows.empty()) return {};
  return "<h2>Asynchronous merges</h2>\n<table><thead><tr><th>node</th><th>phases</th><th>inner steps/s</th>"
         "<th>tokens trained</th><th>tokens merged</th><th>goodput (merged / trained)</th>"
         "<th>merged tokens/s</th><th>mean staleness</th><th>max staleness</th><th>dropped</th></tr></thead>"
         "<tbody>\n" +
         rows + "</tbody></table>\n";
}

// A cluster's memberships over time: one row per epoch that a node entered after the first.
std::string membership_table(const report_data& r) {
  struct epoch_row {
    double ts = HUGE_VAL;
    std::vector<std::string> nodes;
  };
  // Each coordinator counts epochs from 1: a resumed cluster's epoch 1 is another membership than the first
  // session's, told apart by its members and kept round. Rows in time order.
  using key = std::tuple<double, std::string, double, double>;  // epoch, members, kept round, fragment
  std::map<key, epoch_row> epochs;
  for (const auto& m : r.nodes)
    for (const auto& rec : m.memberships) {
      auto& e = epochs[key{num(rec, "epoch"), text(rec, "members"), num(rec, "kept_round"),
                           num(rec, "kept_fragment")}];
      e.ts = std::min(e.ts, num(rec, "ts"));
      e.nodes.push_back(m.name);
    }
  if (epochs.empty()) return {};
  std::vector<std::pair<const key*, const epoch_row*>> rows;
  for (const auto& [k, e] : epochs) rows.emplace_back(&k, &e);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second->ts < b.second->ts; });
  std::string o =
      "<h2>Membership</h2>\n<table><thead><tr><th>epoch</th><th>from (UTC)</th><th>members</th>"
      "<th>kept all-reduce (round, fragment)</th><th>reported by</th></tr></thead><tbody>\n";
  for (const auto& [k, e] : rows) {
    const auto& [epoch, members, kept_round, kept_fragment] = *k;
    std::string by;
    for (const auto& n : e->nodes) by += (by.empty() ? "" : ", ") + n;
    o += fmt::format("<tr><th>{}</th><td>{}</td><td>{}</td><td>{}, {}</td><td>{}</td></tr>\n", compact(epoch),
                     html_escape(utc_text(e->ts)), html_escape(members), compact(kept_round),
                     compact(kept_fragment), html_escape(by));
  }
  return o + "</tbody></table>\n";
}

// Nodes that joined the running cluster: where their state came from, its size and how long it took.
std::string recovery_table(const report_data& r) {
  std::string rows;
  for (const auto& m : r.nodes)
    for (const auto& rec : m.recoveries) {
      const double mb = num(rec, "bytes") / 1e6, s = num(rec, "seconds");
      rows += fmt::format(
          "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.2f}</td><td>{}</"
          "td>"
          "</tr>\n",
          html_escape(m.name), html_escape(utc_text(num(rec, "ts"))), compact(num(rec, "epoch")),
          compact(num(rec, "round")), html_escape(text(rec, "source")), mb, s,
          s > 0 ? fmt::format("{:.1f}", mb / s) : std::string("—"));
    }
  if (rows.empty()) return {};
  return "<h2>Joins</h2>\n<table><thead><tr><th>node</th><th>at (UTC)</th><th>epoch</th><th>state of "
         "round</th>"
         "<th>from</th><th>MB</th><th>seconds</th><th>MB/s</th></tr></thead><tbody>\n" +
         rows + "</tbody></table>\n";
}

std::string charts_section(const report_data& r) {
  std::string o = "<h2>Charts</h2>\n<section class=\"charts\">\n";
  int id = 0;
  for (const auto& c : build_charts(r)) {
    ++id;
    size_t points = 0;
    for (const auto& l : c.lines) points += l.points.size();
    if (has_data(c))
      o += "<figure>\n" + render_svg(c, id) + "</figure>\n";
    else if (points > 0)  // a diverged run's losses (null, NaN, infinite): nothing to draw
      o += fmt::format(
          "<div class=\"empty\"><b>{}</b>None of its {} values in metrics.jsonl is a finite "
          "number (did the run diverge?).</div>\n",
          html_escape(c.title), points);
    else
      o += fmt::format("<div class=\"empty\"><b>{}</b>No records for this chart in metrics.jsonl.</div>\n",
                       html_escape(c.title));
  }
  return o + "</section>\n";
}

std::string page_footer(const report_data& r) {
  std::string o = "<footer>\n";
  for (const auto& m : r.nodes)
    o += fmt::format(
        "<div>{}: {} records{}</div>\n", html_escape(m.path), m.n_records,
        m.n_skipped ? fmt::format(", {} malformed line{} skipped", m.n_skipped, m.n_skipped > 1 ? "s" : "")
                    : "");
  std::time_t now = std::time(nullptr);
  o += fmt::format("<div>generated by longwave report, {}</div>\n", utc_text(static_cast<double>(now)));
  return o + "</footer>\n</main>\n</body>\n</html>\n";
}

std::string assemble_page(const report_data& r) {
  const bool cluster = r.nodes.size() > 1;
  static const record no_start;
  const auto& first = r.nodes.front();
  const start_fields field{first.starts.empty() ? no_start : first.starts.back()};
  const run_summary sum = summarize_run(r);

  std::string o = page_head(r, field, sum.status);
  std::string ppl_of;  // separate runs: the first with a figure (summarize_run's overall)
  for (size_t i = 0; r.separate_runs && ppl_of.empty() && i < sum.nodes.size(); ++i)
    if (std::isfinite(sum.nodes[i].final_val_ppl)) ppl_of = r.nodes[i].name;
  o += headline_cards(sum, r.t_last - r.t0, ppl_of);
  o += "<h2>Summary</h2>\n<section class=\"tables\">\n";
  o += configuration_table(cluster, sum, field);
  o += outcome_table(r, sum, field);
  o += "</section>\n";
  if (cluster) o += nodes_table(r, sum) + async_table(r, sum) + membership_table(r) + recovery_table(r);
  o += charts_section(r);
  o += page_footer(r);
  return o;
}

/// RUN_DIR/metrics.jsonl (a single run), else every RUN_DIR/<node>/metrics.jsonl (a cluster run) by name.
std::vector<fs::path> metrics_files(const std::string& run_dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  // A run's own file, or its nodes' (a run's out_dir is not also a cluster's): one run is never read twice.
  if (fs::is_regular_file(fs::path(run_dir) / "metrics.jsonl", ec))
    return {fs::path(run_dir) / "metrics.jsonl"};
  std::vector<fs::path> node_files;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.is_directory(ec) && fs::is_regular_file(e.path() / "metrics.jsonl", ec))
      node_files.push_back(e.path() / "metrics.jsonl");
  std::sort(node_files.begin(), node_files.end());
  files.insert(files.end(), node_files.begin(), node_files.end());
  return files;
}

/// A cluster run's RUN_DIR/coordinator.jsonl, into r.coordinator when it holds a valid line (else a warning:
/// the run's status then comes from its nodes alone).
void read_coordinator_file(report_data& r) {
  std::error_code ec;
  const auto path = fs::path(r.run_dir) / "coordinator.jsonl";
  if (fs::is_regular_file(fs::path(r.run_dir) / "metrics.jsonl", ec) || !fs::is_regular_file(path, ec))
    return;
  node_metrics c;
  if (const auto err = read_metrics_file(path, c); !err.empty()) {
    fmt::print(stderr, "report: warning: {}; the run's status comes from its nodes alone\n", err);
    return;
  }
  r.coordinator = std::move(c);
}

/// Only the newest run in the out_dir is reported. A node's records before its newest start from step 0 are
/// left out (records.cpp); so is a node whose records all end before the newest run began: before the last
/// start from step 0 of a node that did not join by fetching the state (--fresh deletes the nodes' files,
/// but not those of a node since taken out of the cluster file). Says what it leaves out.
void leave_out_earlier_runs(report_data& r) {
  double began = -HUGE_VAL;
  for (const auto& m : r.nodes) {
    if (m.earlier_runs > 0)
      fmt::print(stderr,
                 "report: note: {}: left out {} earlier run{} in this file (it started again from step 0, "
                 "as a run stopped before its first checkpoint does)\n",
                 m.path, m.earlier_runs, m.earlier_runs == 1 ? "" : "s");
    if (m.starts.empty() || num(m.starts.front(), "resumed_step") != 0 || m.sessions.empty()) continue;
    const bool joined =
        num(m.starts.front(), "joined") == 1 ||
        (!m.recoveries.empty() && num(m.recoveries.front(), "ts") <= m.sessions.front().second);
    if (!joined && std::isfinite(m.sessions.front().first)) began = std::max(began, m.sessions.front().first);
  }
  if (!std::isfinite(began)) return;
  const auto before = [&](const node_metrics& m) {
    return !m.sessions.empty() && m.sessions.back().second < began;
  };
  for (const auto& m : r.nodes)
    if (before(m))
      fmt::print(stderr,
                 "report: note: {}: left out: its records end at {}, before this run's nodes started from "
                 "step 0 at {} (a node of an earlier run in this out_dir)\n",
                 m.path, utc_text(m.sessions.back().second), utc_text(began));
  r.nodes.erase(std::remove_if(r.nodes.begin(), r.nodes.end(), before), r.nodes.end());
}

/// A cluster whose coordinator ran but none of whose nodes trained (a launch interrupted before training, a
/// cluster called off at its join deadline): what the coordinator's record says of it. "" otherwise.
std::string never_trained(const std::string& run_dir) {
  std::error_code ec;
  const auto path = fs::path(run_dir) / "coordinator.jsonl";
  if (!fs::is_regular_file(path, ec)) return "";
  node_metrics c;
  if (!read_metrics_file(path, c).empty()) return "";
  std::string how = "it has no end record: it may still be running, or was killed";
  if (!c.ends.empty()) {
    const auto& end = c.ends.back();
    how = fmt::format("it ended '{}'", text(end, "outcome"));
    if (const auto why = text(end, "why"); !why.empty()) how += ": " + why;
  }
  return fmt::format(
      "{}: no node of this cluster wrote a metrics.jsonl, so it never trained and there is "
      "nothing to report; its coordinator's record ({}) says {}",
      run_dir, path.string(), how);
}

/// Where the page goes: `out` with its links followed (the link stays a link), checked before anything is
/// read. Refused, with a line: a directory or special file (a pipe, a device: the page is written through a
/// temporary file and a rename), one of the report's own inputs, an existing file that is not an HTML page,
/// or a missing directory.
/// `given`: --out named it (else it is the run's report.html, and the line says so).
std::optional<fs::path> page_path(const std::string& out, const std::vector<fs::path>& inputs, bool given) {
  auto refuse = [&](const std::string& why) {
    fmt::print(stderr, "report: error: {}{}: {}\n", given ? "--out " : "the page ", out, why);
    return std::nullopt;
  };
  std::error_code ec;
  fs::path target = fs::absolute(out);
  for (int hops = 0; fs::is_symlink(target, ec); ++hops) {  // a link to a page not yet written included
    if (hops == 40) return refuse("too many levels of symbolic links");
    const fs::path to = fs::read_symlink(target, ec);
    target = to.is_absolute() ? to : target.parent_path() / to;
  }
  target = fs::weakly_canonical(target, ec);
  if (ec) return refuse(ec.message());
  const auto st = fs::status(target, ec);
  if (fs::exists(st)) {
    if (!fs::is_regular_file(st))
      return refuse(fs::is_directory(st) ? "is a directory; name the page's file"
                                         : "is not a regular file (a pipe or a device); name a file");
    for (const auto& in : inputs)
      if (fs::equivalent(target, in, ec))
        return refuse("is the run's " + in.string() + ", which the report reads");
    std::ifstream f(target, std::ios::binary);
    std::string head(16, '\0');
    f.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(f.gcount()));
    if (!head.empty() && head.rfind("<!DOCTYPE html", 0) != 0)
      return refuse("exists and is not an HTML page; remove it or name another file");
  }
  if (!fs::is_directory(target.parent_path(), ec))
    return refuse(fs::exists(target.parent_path(), ec)
                      ? target.parent_path().string() + " is a file, not a directory"
                      : "the directory " + target.parent_path().string() + " does not exist");
  return target;
}

}  // namespace

const char* page_css() {
  return css;
}

int write(const std::string& run_dir, const std::string& out_path) {
  auto error = [](const std::string& msg) {
    fmt::print(stderr, "report: error: {}\n", msg);
    return 2;
  };
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) return error(fmt::format("{}: no such run directory", run_dir));
  if (!fs::is_directory(run_dir, ec))
    return error(fmt::format("{}: not a directory (pass the run's out_dir)", run_dir));
  const auto own = fs::path(run_dir) / "metrics.jsonl";
  if (const auto st = fs::status(own, ec); fs::exists(st) && !fs::is_regular_file(st))
    return error(fmt::format("{}: {}", own.string(),
                             fs::is_directory(st) ? "is a directory, not a run's metrics file"
                                                  : "is not a regular file (a pipe or a device)"));
  auto files = metrics_files(run_dir);
  if (files.empty())
    if (const auto why = never_trained(run_dir); !why.empty()) return error(why);
  if (files.empty())
    return error(
        fmt::format("{}: not found, nor any {}/<node>/metrics.jsonl (is this a run's out_dir, from a "
                    "longwave that writes "
                    "metrics.jsonl?)",
                    (fs::path(run_dir) / "metrics.jsonl").string(), run_dir));

  const std::string out_arg = out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
  const auto out = page_path(out_arg, files, !out_path.empty());
  if (!out) return 2;

  report_data r;
  r.run_dir = run_dir;
  std::set<std::string> names;
  std::vector<std::string> unreadable;  // a cluster's node files without a valid line: named, left out
  for (const auto& f : files) {
    node_metrics m;
    if (auto err = read_metrics_file(f, m); !err.empty()) {
      if (files.size() == 1) return error(err);
      fmt::print(stderr, "report: warning: {}; that node is left out\n", err);
      unreadable.push_back(f.string());
      continue;
    }
    m.name = m.starts.empty() ? std::string() : text(m.starts.front(), "node");
    const std::string folder = fs::absolute(f).parent_path().filename().string();
    if (m.name.empty()) m.name = folder;
    if (!names.insert(m.name).second) m.name += " (" + folder + ")";
    r.nodes.push_back(std::move(m));
  }
  if (r.nodes.empty()) return error(fmt::format("{}: no node's metrics.jsonl holds a valid line", run_dir));
  read_coordinator_file(r);
  // A cluster node's start line counts the cluster's workers; a run alone, its own.
  r.separate_runs =
      r.nodes.size() > 1 && std::all_of(r.nodes.begin(), r.nodes.end(), [](const node_metrics& m) {
        return !m.starts.empty() &&
               num(m.starts.front(), "cluster_workers") <= num(m.starts.front(), "workers");
      });
  if (r.separate_runs) {
    std::string names;
    for (const auto& m : r.nodes) names += (names.empty() ? "" : ", ") + m.name;
    fmt::print(
        stderr,
        "report: warning: {} holds {} separate runs ({}), not one cluster's nodes: each gets a row and "
        "series, and the summary adds them up; for one run's page, report its own out_dir\n",
        run_dir, r.nodes.size(), names);
  } else {
    leave_out_earlier_runs(r);
  }
  find_time_span(r);

  if (const auto err = runtime::write_atomically(out->string(), assemble_page(r)); !err.empty()) {
    fmt::print(stderr, "report: error: {}\n", err);
    return 1;
  }
  size_t n_records = 0;
  for (const auto& m : r.nodes) n_records += m.n_records;
  fmt::print("report: wrote {} ({} records from {} file{}{})\n", out_arg, n_records, r.nodes.size(),
             r.nodes.size() > 1 ? "s" : "",
             unreadable.empty() ? "" : fmt::format("; {} left out", unreadable.size()));
  return 0;
}

}  // namespace longwave::cli::report
