// The report's charts: which records become which lines, with their names, colors and styles.
#include "cli/report/run_charts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "cli/report/format.hpp"

namespace longwave::cli::report {
namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// A time axis in seconds, minutes or hours, whichever reads best for the run's length.
std::pair<double, std::string> time_unit(double span_s) {
  if (span_s >= 3 * 3600) return {3600, "h"};
  if (span_s >= 600) return {60, "min"};
  return {1, "s"};
}

/// A record's time on the time axis: since the run's first start, in the axis unit.
struct time_axis {
  double t0, div;
  double operator()(const record& o) const { return (num(o, "ts") - t0) / div; }
};

line_chart make_chart(std::string title, std::string x_label, std::string y_label,
                      std::vector<double> marks) {
  line_chart c;
  c.title = std::move(title), c.x_label = std::move(x_label), c.y_label = std::move(y_label);
  c.x_marks = std::move(marks);
  return c;
}

/// The six charts, empty, with their labels and axis options (all-reduce y labels are set by the data).
struct run_chart_set {
  line_chart loss, ppl, util, stall, ar_s, ar_b;
};

run_chart_set empty_charts(const report_data& r, const time_axis& t_of, const std::string& time_label) {
  // Resume marks: later start lines, on the step axis and on the time axis.
  std::set<double> resumed_steps, resumed_times;
  for (const auto& m : r.nodes)
    for (size_t i = 1; i < m.starts.size(); ++i) {
      if (const double s = num(m.starts[i], "resumed_step"); std::isfinite(s)) resumed_steps.insert(s);
      if (const double t = t_of(m.starts[i]); std::isfinite(t)) resumed_times.insert(t);
    }
  const std::vector<double> step_marks(resumed_steps.begin(), resumed_steps.end());
  const std::vector<double> time_marks(resumed_times.begin(), resumed_times.end());
  run_chart_set c{make_chart("Loss", "inner step (per worker)", "loss", step_marks),
                  make_chart("Validation perplexity", "inner step (per worker)", "perplexity", step_marks),
                  make_chart("Compute utilization per worker (each outer round)", time_label,
                             "inner compute / wall time (%)", time_marks),
                  make_chart("Stall seconds per worker (each outer round)", time_label,
                             "seconds waiting on a late result", time_marks),
                  make_chart("All-reduce duration per round", "outer round", "seconds", {}),
                  make_chart("All-reduce bytes sent per round", "outer round", "", {})};
  c.util.y_range = std::pair{0.0, 100.0};
  c.stall.y_from_zero = true;
  c.loss.x_from_zero = c.ppl.x_from_zero = c.util.x_from_zero = c.stall.x_from_zero = true;
  c.ar_s.x_integer = c.ar_b.x_integer = c.ar_s.y_from_zero = c.ar_b.y_from_zero = true;
  return c;
}

// Train loss: every step, plus a moving average on long runs so the trend shows through the noise. Then
// the validation loss, and the validation perplexity in its own chart.
void add_loss_lines(run_chart_set& c, const node_metrics& m, const std::string& node_color, bool cluster) {
  const std::string prefix = cluster ? m.name + " " : "";
  series raw{prefix + "train", node_color};
  for (const auto& s : m.steps) raw.points.push_back({s.step, s.loss});
  std::sort(raw.points.begin(), raw.points.end(), [](point a, point b) { return a.x < b.x; });
  if (raw.points.size() > 60) {
    series smooth{raw.name + " (moving average)", node_color};
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
    c.loss.lines.push_back(std::move(raw));
    c.loss.lines.push_back(std::move(smooth));
  } else {
    c.loss.lines.push_back(std::move(raw));
  }
  series val_loss{prefix + "validation", node_color}, val_ppl{cluster ? m.name : "validation", node_color};
  val_loss.dashed = val_loss.markers = val_ppl.markers = true;
  for (const auto& e : m.evals) {
    val_loss.points.push_back({num(e, "step"), num(e, "val_loss")});
    val_ppl.points.push_back({num(e, "step"), num(e, "val_ppl")});
  }
  if (!val_loss.points.empty()) c.loss.lines.push_back(std::move(val_loss));
  c.ppl.lines.push_back(std::move(val_ppl));
}

// Per worker, in worker order, with a gap where the run was down between sessions.
void add_worker_lines(run_chart_set& c, const node_metrics& m, const std::string& node_color, bool cluster,
                      const time_axis& t_of) {
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
  // A node's first 64 workers are drawn; the legend names how many more there are (a page stays readable).
  constexpr size_t most_drawn = 64;
  size_t k = 0;
  for (auto& [id, lines] : per_worker) {
    if (k == most_drawn) {
      series more(fmt::format("{}{} more worker{}, not drawn", cluster ? m.name + ": " : "",
                              per_worker.size() - k, per_worker.size() - k == 1 ? "" : "s"),
                  "#999999");
      c.util.lines.push_back(more);
      c.stall.lines.push_back(std::move(more));
      break;
    }
    auto& [u, st] = lines;
    u.name = st.name = cluster ? fmt::format("{} w{}", m.name, id) : fmt::format("worker {}", id);
    const double n_w = static_cast<double>(std::min(per_worker.size(), most_drawn));
    u.color = st.color =
        cluster ? shade(node_color, n_w > 1 ? -0.35 + 0.75 * static_cast<double>(k) / (n_w - 1) : 0)
                : color(k);
    u.dashed = st.dashed = !cluster && k >= n_palette_colors;
    u.markers = st.markers = u.points.size() <= 40;
    ++k;
    c.util.lines.push_back(std::move(u));
    c.stall.lines.push_back(std::move(st));
  }
}

/// All-reduce seconds (in s_div units) and bytes (in b_div units) per round.
void add_allreduce_lines(run_chart_set& c, const node_metrics& m, const std::string& node_color, bool cluster,
                         double s_div, double b_div) {
  series secs{cluster ? m.name : "all-reduce", node_color},
      bytes{cluster ? m.name : "bytes sent", node_color};
  for (const auto& a : m.allreduces) {
    secs.points.push_back({num(a, "round"), num(a, "seconds") / s_div});
    bytes.points.push_back({num(a, "round"), num(a, "bytes_sent") / b_div});
  }
  secs.markers = bytes.markers = secs.points.size() <= 60;
  c.ar_s.lines.push_back(std::move(secs));
  c.ar_b.lines.push_back(std::move(bytes));
}

}  // namespace

std::vector<line_chart> build_charts(const report_data& r) {
  const bool cluster = r.nodes.size() > 1;
  const auto [t_div, t_unit] = time_unit(r.t_last - r.t0);
  const time_axis t_of{r.t0, t_div};
  auto c = empty_charts(r, t_of, fmt::format("wall time since the first start ({})", t_unit));

  double max_bytes = 0, max_ar_s = 0;
  for (const auto& m : r.nodes)
    for (const auto& a : m.allreduces) {
      if (std::isfinite(num(a, "bytes_sent"))) max_bytes = std::max(max_bytes, num(a, "bytes_sent"));
      if (std::isfinite(num(a, "seconds"))) max_ar_s = std::max(max_ar_s, num(a, "seconds"));
    }
  const auto [b_div, b_unit] = byte_unit(max_bytes);
  c.ar_b.y_label = b_unit + " sent by the node";
  const double s_div = max_ar_s < 1 ? 1e-3 : 1;
  c.ar_s.y_label = s_div < 1 ? "milliseconds" : "seconds";

  for (size_t n = 0; n < r.nodes.size(); ++n) {
    const auto& m = r.nodes[n];
    add_loss_lines(c, m, color(n), cluster);
    add_worker_lines(c, m, color(n), cluster, t_of);
    add_allreduce_lines(c, m, color(n), cluster, s_div, b_div);
  }
  return {c.loss, c.ppl, c.util, c.stall, c.ar_s, c.ar_b};
}

}  // namespace longwave::cli::report
