// The report page: per-node summaries, the charts built from the records, and the HTML around them.
#include "actors/cli/report/page.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/cli/report/charts.hpp"
#include "actors/cli/report/records.hpp"

namespace longwave::cli::report {
namespace {

namespace fs = std::filesystem;

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// matplotlib's tab10: distinct, readable on white; lines past ten are dashed.
const char* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string color(size_t i) {
  return palette[i % std::size(palette)];
}

// `t` in -1..1: darker toward black below 0, lighter toward white above.
std::string shade(const std::string& hex, double t) {
  unsigned rgb[3] = {0, 0, 0};
  if (std::sscanf(hex.c_str(), "#%02x%02x%02x", &rgb[0], &rgb[1], &rgb[2]) != 3) return hex;
  for (auto& v : rgb) v = static_cast<unsigned>(std::lround(t < 0 ? v * (1 + t) : v + (255 - v) * t));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

std::string compact(double v) {
  return std::isfinite(v) ? fmt::format("{}", v) : std::string("–");
}

std::string fixed(double v, int decimals) {
  return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : std::string("–");
}

std::string with_commas(double v) {
  std::string s = fmt::format("{:.0f}", v);
  for (int i = static_cast<int>(s.size()) - 3; i > (s[0] == '-' ? 1 : 0); i -= 3)
    s.insert(static_cast<size_t>(i), ",");
  return s;
}

// Decimal units, as network rates are: 1 MB = 10^6 bytes.
std::pair<double, std::string> byte_unit(double max_bytes) {
  if (max_bytes >= 1e9) return {1e9, "GB"};
  if (max_bytes >= 1e6) return {1e6, "MB"};
  if (max_bytes >= 1e3) return {1e3, "kB"};
  return {1, "bytes"};
}

std::string bytes_text(double b) {
  if (!std::isfinite(b)) return "–";
  const auto [div, unit] = byte_unit(b);
  return div == 1 ? fmt::format("{} bytes", with_commas(b))
                  : fmt::format("{:.2f} {} ({} bytes)", b / div, unit, with_commas(b));
}

std::string bytes_short(double b) {
  if (!std::isfinite(b)) return "–";
  const auto [div, unit] = byte_unit(b);
  return div == 1 ? fmt::format("{} bytes", with_commas(b)) : fmt::format("{:.2f} {}", b / div, unit);
}

std::string duration_text(double s) {
  if (!std::isfinite(s)) return "–";
  if (s < 60) return fmt::format("{:.1f} s", s);
  const long t = std::lround(s);
  if (t < 3600) return fmt::format("{}m {:02}s", t / 60, t % 60);
  return fmt::format("{}h {:02}m {:02}s", t / 3600, t / 60 % 60, t % 60);
}

std::string utc_text(double ts) {
  if (!std::isfinite(ts)) return "–";
  const std::time_t t = static_cast<std::time_t>(ts);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

/// A per-node view of what the page shows.
struct node_summary {
  double final_val_loss = nan, final_val_ppl = nan, utilization = nan, stall_s = 0, last_step = nan;
  double allreduce_mean_s = nan, active_s = 0;
  std::string status;
};

node_summary summarize(const node_metrics& m) {
  node_summary s;
  // The final evaluation: the end record of the last session if there is one, else the last eval.
  const record* last_end = nullptr;
  if (!m.ends.empty() && (m.starts.empty() || num(m.ends.back(), "ts") >= num(m.starts.back(), "ts")))
    last_end = &m.ends.back();
  if (!m.evals.empty())
    s.final_val_loss = num(m.evals.back(), "val_loss"), s.final_val_ppl = num(m.evals.back(), "val_ppl");
  if (last_end && std::isfinite(num(*last_end, "val_ppl")))
    s.final_val_loss = num(*last_end, "val_loss"), s.final_val_ppl = num(*last_end, "val_ppl");
  if (!std::isfinite(s.final_val_ppl) && std::isfinite(s.final_val_loss))
    s.final_val_ppl = std::exp(s.final_val_loss);

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
  for (const auto& st : m.steps)
    s.last_step = std::isfinite(s.last_step) ? std::max(s.last_step, num(st, "step")) : num(st, "step");
  double ar_sum = 0;
  size_t n_ar = 0;
  for (const auto& a : m.allreduces)
    if (const double x = num(a, "seconds"); std::isfinite(x)) ar_sum += x, ++n_ar;
  if (n_ar) s.allreduce_mean_s = ar_sum / static_cast<double>(n_ar);
  for (const auto& [first, last] : m.sessions)
    if (std::isfinite(first) && std::isfinite(last)) s.active_s += last - first;

  if (!last_end) {
    s.status = "no end record (still running, or killed)";
  } else {
    const double code = num(*last_end, "exit_code");
    s.status = code == 0     ? "completed"
               : code == 130 ? "interrupted (Ctrl-C)"
                             : fmt::format("failed (exit {})", compact(code));
  }
  return s;
}

struct report_data {
  std::string run_dir;
  std::vector<node_metrics> nodes;
  double t0 = nan, t_last = nan;  // first start and last record, unix seconds
};

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

// A time axis in seconds, minutes or hours, whichever reads best for the run's length.
std::pair<double, std::string> time_unit(double span_s) {
  if (span_s >= 3 * 3600) return {3600, "h"};
  if (span_s >= 600) return {60, "min"};
  return {1, "s"};
}

std::vector<line_chart> build_charts(const report_data& r) {
  const bool cluster = r.nodes.size() > 1;
  const auto [t_div, t_unit] = time_unit(r.t_last - r.t0);
  const std::string time_label = fmt::format("wall time since the first start ({})", t_unit);
  auto t_of = [&, t_div = t_div](const record& o) { return (num(o, "ts") - r.t0) / t_div; };

  // Resume marks: later start lines, on the step axis and on the time axis.
  std::set<double> resumed_steps, resumed_times;
  for (const auto& m : r.nodes)
    for (size_t i = 1; i < m.starts.size(); ++i) {
      if (const double s = num(m.starts[i], "resumed_step"); std::isfinite(s)) resumed_steps.insert(s);
      if (const double t = t_of(m.starts[i]); std::isfinite(t)) resumed_times.insert(t);
    }

  const std::vector<double> step_marks(resumed_steps.begin(), resumed_steps.end());
  const std::vector<double> time_marks(resumed_times.begin(), resumed_times.end());
  auto chart = [](std::string title, std::string x_label, std::string y_label, std::vector<double> marks) {
    line_chart c;
    c.title = std::move(title), c.x_label = std::move(x_label), c.y_label = std::move(y_label);
    c.x_marks = std::move(marks);
    return c;
  };
  line_chart loss = chart("Loss", "inner step (per worker)", "loss", step_marks);
  line_chart ppl = chart("Validation perplexity", "inner step (per worker)", "perplexity", step_marks);
  line_chart util = chart("Compute utilization per worker (each outer round)", time_label,
                          "inner compute / wall time (%)", time_marks);
  util.y_range = std::pair{0.0, 100.0};
  line_chart stall = chart("Stall seconds per worker (each outer round)", time_label,
                           "seconds waiting on a late result", time_marks);
  stall.y_from_zero = true;
  line_chart ar_s = chart("All-reduce duration per round", "outer round", "seconds", {});
  line_chart ar_b = chart("All-reduce bytes sent per round", "outer round", "", {});
  loss.x_from_zero = ppl.x_from_zero = util.x_from_zero = stall.x_from_zero = true;
  ar_s.x_integer = ar_b.x_integer = ar_s.y_from_zero = ar_b.y_from_zero = true;

  double max_bytes = 0, max_ar_s = 0;
  for (const auto& m : r.nodes)
    for (const auto& a : m.allreduces) {
      if (std::isfinite(num(a, "bytes_sent"))) max_bytes = std::max(max_bytes, num(a, "bytes_sent"));
      if (std::isfinite(num(a, "seconds"))) max_ar_s = std::max(max_ar_s, num(a, "seconds"));
    }
  const auto [b_div, b_unit] = byte_unit(max_bytes);
  ar_b.y_label = b_unit + " sent by the node";
  const double s_div = max_ar_s < 1 ? 1e-3 : 1;
  ar_s.y_label = s_div < 1 ? "milliseconds" : "seconds";

  for (size_t n = 0; n < r.nodes.size(); ++n) {
    const auto& m = r.nodes[n];
    const std::string c = color(n), prefix = cluster ? m.name + " " : "";

    // Train loss: every step, plus a moving average on long runs so the trend shows through the noise.
    series raw{prefix + "train", c};
    for (const auto& s : m.steps) raw.points.push_back({num(s, "step"), num(s, "loss")});
    std::sort(raw.points.begin(), raw.points.end(), [](point a, point b) { return a.x < b.x; });
    if (raw.points.size() > 60) {
      series smooth{raw.name + " (moving average)", c};
      const double alpha = 2.0 / (std::clamp(static_cast<double>(raw.points.size()) / 40, 5.0, 200.0) + 1);
      double ema = nan;
      for (const auto& p : raw.points) {
        if (!std::isfinite(p.y)) continue;
        ema = std::isfinite(ema) ? ema + alpha * (p.y - ema) : p.y;
        smooth.points.push_back({p.x, ema});
      }
      raw.name.clear();
      raw.opacity = 0.3;
      raw.width = 1.2;
      loss.lines.push_back(std::move(raw));
      loss.lines.push_back(std::move(smooth));
    } else {
      loss.lines.push_back(std::move(raw));
    }
    series val_loss{prefix + "validation", c}, val_ppl{cluster ? m.name : "validation", c};
    val_loss.dashed = val_loss.markers = val_ppl.markers = true;
    for (const auto& e : m.evals) {
      val_loss.points.push_back({num(e, "step"), num(e, "val_loss")});
      val_ppl.points.push_back({num(e, "step"), num(e, "val_ppl")});
    }
    if (!val_loss.points.empty()) loss.lines.push_back(std::move(val_loss));
    ppl.lines.push_back(std::move(val_ppl));

    // Per worker, in worker order, with a gap where the run was down between sessions.
    std::map<long, std::pair<series, series>> per_worker;
    for (const auto& w : m.workers) {
      const double id = num(w, "worker");
      if (!std::isfinite(id)) continue;
      auto& [u, st] = per_worker[std::lround(id)];
      const double t = t_of(w);
      if (!u.points.empty())
        for (size_t i = 1; i < m.starts.size(); ++i)
          if (const double s = t_of(m.starts[i]); s > u.points.back().x && s <= t) {
            u.points.push_back({nan, nan});
            st.points.push_back({nan, nan});
            break;
          }
      u.points.push_back({t, num(w, "utilization") * 100});
      st.points.push_back({t, num(w, "stall_s")});
    }
    // One color per worker in both charts: distinct colors for one node; in a cluster, shades of the
    // node's color, so a node reads the same in every chart.
    size_t k = 0;
    for (auto& [id, lines] : per_worker) {
      auto& [u, st] = lines;
      u.name = st.name = cluster ? fmt::format("{} w{}", m.name, id) : fmt::format("worker {}", id);
      const double n_w = static_cast<double>(per_worker.size());
      u.color = st.color =
          cluster ? shade(c, n_w > 1 ? -0.35 + 0.75 * static_cast<double>(k) / (n_w - 1) : 0) : color(k);
      u.dashed = st.dashed = !cluster && k >= std::size(palette);
      u.markers = st.markers = u.points.size() <= 40;
      ++k;
      util.lines.push_back(std::move(u));
      stall.lines.push_back(std::move(st));
    }

    series secs{cluster ? m.name : "all-reduce", c}, bytes{cluster ? m.name : "bytes sent", c};
    for (const auto& a : m.allreduces) {
      secs.points.push_back({num(a, "round"), num(a, "seconds") / s_div});
      bytes.points.push_back({num(a, "round"), num(a, "bytes_sent") / b_div});
    }
    secs.markers = bytes.markers = secs.points.size() <= 60;
    ar_s.lines.push_back(std::move(secs));
    ar_b.lines.push_back(std::move(bytes));
  }
  return {loss, ppl, util, stall, ar_s, ar_b};
}

const char* const page_css = R"(
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

std::string assemble_page(const report_data& r) {
  const bool cluster = r.nodes.size() > 1;
  const auto& first = r.nodes.front();
  static const record no_start;
  const record& cfg = first.starts.empty() ? no_start : first.starts.front();
  auto field = [&](const char* key) {
    const auto* v = cfg.find(key);
    if (!v) return std::string("–");
    return v->is_string ? v->str : compact(num(cfg, key));
  };

  std::vector<node_summary> sums;
  double bytes = 0, compute = 0, wall = 0, workers = 0, active = 0, stall = 0;
  size_t sessions = 0, n_checkpoints = 0;
  for (const auto& m : r.nodes) {
    sums.push_back(summarize(m));
    bytes += m.bytes_sent;
    sessions = std::max(sessions, m.starts.size());
    n_checkpoints += m.checkpoints.size();
    active = std::max(active, sums.back().active_s);
    stall += sums.back().stall_s;
    if (!m.starts.empty()) workers += num(m.starts.front(), "workers");
    for (const auto& w : m.workers)
      if (std::isfinite(num(w, "compute_s")) && std::isfinite(num(w, "wall_s")))
        compute += num(w, "compute_s"), wall += num(w, "wall_s");
  }
  // Cluster nodes evaluate the same global parameters; the first node with an evaluation speaks for all.
  node_summary overall = sums.front();
  for (const auto& s : sums)
    if (std::isfinite(s.final_val_ppl)) {
      overall.final_val_ppl = s.final_val_ppl, overall.final_val_loss = s.final_val_loss;
      break;
    }
  double util = wall > 0 ? compute / wall : nan;
  if (!std::isfinite(util)) {  // no compute/wall split recorded: mean of the per-node figures
    double sum = 0, n = 0;
    for (const auto& s : sums)
      if (std::isfinite(s.utilization)) sum += s.utilization, ++n;
    if (n > 0) util = sum / n;
  }
  std::string status = sums.front().status;
  for (const auto& s : sums)
    if (s.status != "completed") status = s.status;
  const double total_s = r.t_last - r.t0;
  const double params = num(cfg, "params");
  const double rounds = num(cfg, "rounds"), h = num(cfg, "inner_steps");

  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  o += fmt::format("<title>Longwave report: {}</title>\n", html_escape(first.name));
  o += fmt::format("<style>{}</style>\n</head>\n<body>\n<main>\n", page_css);
  o += fmt::format("<h1>Longwave run report: {}</h1>\n",
                   html_escape(cluster ? fs::path(r.run_dir).filename().string() : first.name));
  o += fmt::format("<p class=\"sub\">{} &middot; {} {} &middot; started {} &middot; {}</p>\n",
                   html_escape(r.run_dir), html_escape(field("mode")),
                   cluster ? fmt::format("&middot; {} nodes", r.nodes.size()) : "", utc_text(r.t0),
                   html_escape(status));

  // Headline numbers.
  auto card = [](const std::string& k, const std::string& v, const char* cls = "") {
    return fmt::format("<div class=\"card\"><div class=\"k\">{}</div><div class=\"v {}\">{}</div></div>\n", k,
                       cls, html_escape(v));
  };
  o += "<section class=\"cards\">\n";
  o += card("final val perplexity", fixed(overall.final_val_ppl, 3));
  o += card("total time", duration_text(total_s));
  o += card("avg utilization", std::isfinite(util) ? fixed(util * 100, 1) + " %" : "–");
  o += card("bytes sent", bytes_short(bytes));
  o += card("status", status, status == "completed" ? "ok" : "warn");
  o += "</section>\n";

  // Summary tables.
  o += "<h2>Summary</h2>\n<section class=\"tables\">\n";
  o += table("Configuration",
             {{"mode", field("mode")},
              {"model preset", field("preset")},
              {"parameters",
               std::isfinite(params) ? fmt::format("{:.2f} M ({})", params / 1e6, with_commas(params)) : "–"},
              {cluster ? "workers (all nodes)" : "workers", cluster ? compact(workers) : field("workers")},
              {"outer rounds", field("rounds")},
              {"inner steps per round (H)", field("inner_steps")},
              {"batch size × sequence length", field("batch_size") + " × " + field("seq_len")},
              {"inner learning rate (AdamW)", field("inner_lr")},
              {"outer learning rate / momentum", field("outer_lr") + " / " + field("outer_momentum")},
              {"all-reduce dtype", field("comm_dtype")}});
  const double last_step = overall.last_step;
  o += table("Outcome",
             {{"status", status},
              {"started", utc_text(r.t0)},
              {"total time (first start to last record)", duration_text(total_s)},
              {"training time (sum of sessions)", duration_text(active)},
              {"sessions", sessions > 1 ? fmt::format("{} (resumed {})", sessions,
                                                      sessions == 2 ? std::string("once")
                                                                    : fmt::format("{} times", sessions - 1))
                                        : compact(double(sessions))},
              {"inner steps per worker",
               std::isfinite(rounds * h) ? fmt::format("{} of {}", compact(last_step), compact(rounds * h))
                                         : compact(last_step)},
              {"final val loss", fixed(overall.final_val_loss, 4)},
              {"final val perplexity", fixed(overall.final_val_ppl, 3)},
              {"average compute utilization", std::isfinite(util) ? fixed(util * 100, 1) + " %" : "–"},
              {"stall seconds (all workers)", fixed(stall, 2)},
              {"total bytes sent", bytes_text(bytes)},
              {"checkpoints written", compact(double(n_checkpoints))}});
  o += "</section>\n";

  if (cluster) {
    o +=
        "<h2>Nodes</h2>\n<table><thead><tr><th>node</th><th>workers</th><th>sessions</th><th>inner steps</th>"
        "<th>final val ppl</th><th>utilization</th><th>mean all-reduce</th><th>bytes sent</th><th>status</th>"
        "</tr></thead><tbody>\n";
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      const auto& m = r.nodes[i];
      const auto& s = sums[i];
      o += fmt::format(
          "<tr><th><span style=\"color:{}\">&#9632;</span> "
          "{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
          color(i), html_escape(m.name), m.starts.empty() ? "–" : compact(num(m.starts.front(), "workers")),
          m.starts.size(), compact(s.last_step), fixed(s.final_val_ppl, 3),
          std::isfinite(s.utilization) ? fixed(s.utilization * 100, 1) + " %" : "–",
          std::isfinite(s.allreduce_mean_s) ? fixed(s.allreduce_mean_s, 3) + " s" : "–",
          html_escape(bytes_short(m.bytes_sent)), html_escape(s.status));
    }
    o += "</tbody></table>\n";
  }

  o += "<h2>Charts</h2>\n<section class=\"charts\">\n";
  int id = 0;
  for (const auto& c : build_charts(r)) {
    ++id;
    if (has_data(c))
      o += "<figure>\n" + render_svg(c, id) + "</figure>\n";
    else
      o += fmt::format("<div class=\"empty\"><b>{}</b>No records for this chart in metrics.jsonl.</div>\n",
                       html_escape(c.title));
  }
  o += "</section>\n<footer>\n";
  for (const auto& m : r.nodes)
    o += fmt::format(
        "<div>{}: {} records{}</div>\n", html_escape(m.path), m.n_records,
        m.n_skipped ? fmt::format(", {} malformed line{} skipped", m.n_skipped, m.n_skipped > 1 ? "s" : "")
                    : "");
  std::time_t now = std::time(nullptr);
  o += fmt::format("<div>generated by longwave report, {}</div>\n", utc_text(static_cast<double>(now)));
  o += "</footer>\n</main>\n</body>\n</html>\n";
  return o;
}

}  // namespace

int write(const std::string& run_dir, const std::string& out_path) {
  auto error = [](const std::string& msg) {
    fmt::print(stderr, "report: error: {}\n", msg);
    return 2;
  };
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) return error(fmt::format("{}: no such run directory", run_dir));
  if (!fs::is_directory(run_dir, ec))
    return error(fmt::format("{}: not a directory (pass the run's out_dir)", run_dir));

  // A single run has RUN_DIR/metrics.jsonl; a cluster run has one per node folder.
  std::vector<fs::path> files;
  if (fs::is_regular_file(fs::path(run_dir) / "metrics.jsonl", ec))
    files.push_back(fs::path(run_dir) / "metrics.jsonl");
  std::vector<fs::path> node_files;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.is_directory(ec) && fs::is_regular_file(e.path() / "metrics.jsonl", ec))
      node_files.push_back(e.path() / "metrics.jsonl");
  std::sort(node_files.begin(), node_files.end());
  files.insert(files.end(), node_files.begin(), node_files.end());
  if (files.empty())
    return error(
        fmt::format("{}: not found, nor any {}/<node>/metrics.jsonl (is this a run's out_dir, from a "
                    "longwave that writes "
                    "metrics.jsonl?)",
                    (fs::path(run_dir) / "metrics.jsonl").string(), run_dir));

  report_data r;
  r.run_dir = run_dir;
  std::set<std::string> names;
  for (const auto& f : files) {
    node_metrics m;
    if (auto err = read_metrics_file(f, m); !err.empty()) return error(err);
    m.name = m.starts.empty() ? std::string() : text(m.starts.front(), "node");
    const std::string folder = fs::absolute(f).parent_path().filename().string();
    if (m.name.empty()) m.name = folder;
    if (!names.insert(m.name).second) m.name += " (" + folder + ")";
    r.nodes.push_back(std::move(m));
  }
  find_time_span(r);

  const std::string out = out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent, ec))
    return error(fmt::format("{}: the output directory does not exist", parent.string()));
  const std::string page = assemble_page(r);
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << page;
    if (!f.flush()) {
      fmt::print(stderr, "report: error: {}: cannot write: {}\n", tmp, std::strerror(errno));
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    fmt::print(stderr, "report: error: {}: cannot write: {}\n", out, std::strerror(errno));
    return 1;
  }
  size_t n_records = 0;
  for (const auto& m : r.nodes) n_records += m.n_records;
  fmt::print("report: wrote {} ({} records from {} file{})\n", out, n_records, files.size(),
             files.size() > 1 ? "s" : "");
  return 0;
}

}  // namespace longwave::cli::report
