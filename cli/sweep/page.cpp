// The sweep's HTML page: charts of final loss against the swept keys, loss curves, a heat map, the fits and
// the results table.
#include "cli/sweep/page.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "cli/report/charts.hpp"
#include "cli/report/format.hpp"
#include "cli/report/page.hpp"

namespace longwave::cli::sweep {

namespace {

using report::html_escape;

// On top of the report's style sheet: a results table as wide as its columns (scrolls sideways), a small
// value in a card.
const char* const sweep_css = R"(
.wide { overflow-x: auto; }
.wide table { width: max-content; min-width: 100%; }
.wide th, .wide td { white-space: nowrap; overflow-wrap: normal; }
.card .v.long { font-size: 13px; font-weight: 500; overflow-wrap: anywhere; }
)";

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

bool numeric(const std::string& s, double* v = nullptr) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (v) *v = x;
  return !s.empty() && *end == '\0' && std::isfinite(x);
}

/// A swept key's values on an axis: numbers (log10 when positive and spanning 20x or more), or categories
/// at 0, 1, 2, ... in order of first appearance.
struct key_axis {
  std::vector<std::string> values;  // distinct, in axis order
  bool categorical = false, log = false;
  std::string label;

  double x_of(const std::string& v) const {
    if (categorical) return static_cast<double>(std::find(values.begin(), values.end(), v) - values.begin());
    const double x = std::strtod(v.c_str(), nullptr);
    return log ? std::log10(x) : x;
  }
};

key_axis axis_of(const sweep_spec& s, const std::string& key) {
  key_axis a;
  for (const auto& p : s.points)
    if (const auto v = p.value_of(key); std::find(a.values.begin(), a.values.end(), v) == a.values.end())
      a.values.push_back(v);
  a.categorical = !std::all_of(a.values.begin(), a.values.end(), [](const auto& v) { return numeric(v); });
  a.label = key;
  if (a.categorical) {
    std::string names;
    for (size_t i = 0; i < a.values.size(); ++i)
      names += fmt::format("{}{} = {}", i ? ", " : "", i, a.values[i]);
    a.label += " (" + names + ")";
    return a;
  }
  std::sort(a.values.begin(), a.values.end(), [](const auto& x, const auto& y) {
    return std::strtod(x.c_str(), nullptr) < std::strtod(y.c_str(), nullptr);
  });
  const double lo = std::strtod(a.values.front().c_str(), nullptr),
               hi = std::strtod(a.values.back().c_str(), nullptr);
  a.log = lo > 0 && hi / lo >= 20;
  if (a.log) a.label = "log10 " + key;
  return a;
}

/// A key worth a chart: it takes two values or more, and the keys that follow it one to one.
struct chart_key {
  std::string key;
  std::vector<std::string> along;  ///< keys whose values change with it (the [[points]] keys set together)
};

/// Whether key b's values follow key a's one to one over the points.
bool one_to_one(const sweep_spec& s, const std::string& a, const std::string& b) {
  std::map<std::string, std::string> fwd, bwd;
  for (const auto& p : s.points) {
    const auto va = p.value_of(a), vb = p.value_of(b);
    // emplace keeps an earlier pairing: a value paired twice differently breaks the correspondence.
    if (fwd.emplace(va, vb).first->second != vb || bwd.emplace(vb, va).first->second != va) return false;
  }
  return true;
}

/// The swept keys with two values or more, each charted once: a key that follows an earlier one one to one
/// goes with it.
std::vector<chart_key> chart_keys(const sweep_spec& s) {
  std::vector<chart_key> out;
  for (const auto& k : s.keys) {
    std::set<std::string> values;
    for (const auto& p : s.points) values.insert(p.value_of(k));
    if (values.size() < 2) continue;
    auto same =
        std::find_if(out.begin(), out.end(), [&](const chart_key& c) { return one_to_one(s, c.key, k); });
    if (same != out.end())
      same->along.push_back(k);
    else
      out.push_back({k, {}});
  }
  return out;
}

bool finished(const point_result& r) {
  return r.status == "done" && std::isfinite(r.val_loss);
}

/// Final val loss against `key`: one series per combination of the other varying keys, the mean over seeds
/// with a min-max bar.
report::line_chart loss_against(const sweep_spec& s, const std::vector<point_result>& results,
                                const chart_key& ck, const std::vector<chart_key>& keys) {
  const std::string& key = ck.key;
  const key_axis ax = axis_of(s, key);
  report::line_chart c;
  c.title = "Final val loss against " + key;
  c.x_label = ax.label;
  for (size_t i = 0; i < ck.along.size(); ++i) c.x_label += (i ? ", " : "; with ") + ck.along[i];
  c.y_label = s.has_repeats ? "final val loss (mean; bar: min-max over seeds)" : "final val loss";
  c.x_integer = ax.categorical;
  std::map<std::string, std::map<double, std::vector<double>>> lines;  // other keys -> x -> losses
  std::vector<std::string> order;
  for (size_t i = 0; i < s.points.size(); ++i) {
    std::string other;
    for (const auto& k : keys)
      if (k.key != key) other += (other.empty() ? "" : " ") + k.key + "=" + s.points[i].value_of(k.key);
    if (!lines.count(other)) order.push_back(other);
    auto& at = lines[other][ax.x_of(s.points[i].value_of(key))];
    if (finished(results[i])) at.push_back(results[i].val_loss);
  }
  for (size_t li = 0; li < order.size(); ++li) {
    report::series mean(order[li].empty() ? "all points" : order[li], report::color(li));
    mean.markers = true;
    mean.dashed = li >= report::n_palette_colors;
    report::series bars("", report::color(li));
    bars.width = 1.2, bars.opacity = 0.6;
    for (const auto& [x, losses] : lines[order[li]]) {
      if (losses.empty()) continue;
      double sum = 0;
      for (const double l : losses) sum += l;
      mean.points.push_back({x, sum / static_cast<double>(losses.size())});
      if (losses.size() > 1) {
        const auto [lo, hi] = std::minmax_element(losses.begin(), losses.end());
        bars.points.insert(bars.points.end(), {{x, *lo}, {x, *hi}, {nan, nan}});
      }
    }
    c.lines.push_back(std::move(mean));
    if (!bars.points.empty()) c.lines.push_back(std::move(bars));
  }
  return c;
}

/// Val (or train) loss against tokens, one line per point.
report::line_chart curves(const sweep_spec& s, const std::vector<point_result>& results, bool val) {
  report::line_chart c;
  c.title = val ? "Val loss per point" : "Train loss per point";
  c.x_label = "tokens (all workers)";
  c.y_label = val ? "val loss" : "train loss (mean over workers)";
  c.x_from_zero = true;
  for (size_t i = 0; i < s.points.size(); ++i) {
    report::series line(s.points[i].label(s.has_repeats), report::color(i));
    line.dashed = i >= report::n_palette_colors;
    line.markers = val;
    line.width = val ? 2.0 : 1.2;
    for (const auto& [x, y] : val ? results[i].val_curve : results[i].train_curve)
      line.points.push_back({x, y});
    if (line.name.empty()) line.name = s.points[i].id;
    c.lines.push_back(std::move(line));
  }
  return c;
}

/// Viridis at t in [0, 1], from five stops.
std::string viridis(double t) {
  static const double stops[5][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  int rgb[3];
  for (int k = 0; k < 3; ++k)
    rgb[k] = static_cast<int>(std::lround(stops[i][k] + (stops[i + 1][k] - stops[i][k]) * f));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

/// Mean final val loss over two keys (rows: the first, columns: the second), all else averaged.
std::string heat_map(const sweep_spec& s, const std::vector<point_result>& results,
                     const std::string& row_key, const std::string& col_key, int id) {
  const key_axis rows = axis_of(s, row_key), cols = axis_of(s, col_key);
  std::map<std::pair<std::string, std::string>, std::vector<double>> cells;
  for (size_t i = 0; i < s.points.size(); ++i)
    if (finished(results[i]))
      cells[{s.points[i].value_of(row_key), s.points[i].value_of(col_key)}].push_back(results[i].val_loss);
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  std::map<std::pair<std::string, std::string>, double> mean;
  for (const auto& [k, v] : cells) {
    double sum = 0;
    for (const double x : v) sum += x;
    mean[k] = sum / static_cast<double>(v.size());
    lo = std::min(lo, mean[k]), hi = std::max(hi, mean[k]);
  }
  const double left = 130, top = 44, width = 600, right = 16;
  const double cw = (width - left - right) / static_cast<double>(cols.values.size());
  const double ch = std::min(44.0, 300.0 / static_cast<double>(rows.values.size()));
  const double height = top + ch * static_cast<double>(rows.values.size()) + 56;
  std::string o = fmt::format(
      "<svg class=\"chart\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" "
      "aria-labelledby=\"heat{2}-title\">\n<title id=\"heat{2}-title\">Final val loss: {3} by {4}</title>\n"
      "<text class=\"title\" x=\"12\" y=\"24\">Final val loss: {3} (rows) by {4} (columns)</text>\n",
      width, height, id, html_escape(row_key), html_escape(col_key));
  for (size_t r = 0; r < rows.values.size(); ++r) {
    const double y = top + ch * static_cast<double>(r);
    o += fmt::format(
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n", left - 8,
        y + ch / 2, html_escape(rows.values[r]));
    for (size_t c = 0; c < cols.values.size(); ++c) {
      const double x = left + cw * static_cast<double>(c);
      const auto it = mean.find({rows.values[r], cols.values[c]});
      const bool has = it != mean.end();
      const double t = has && hi > lo ? (it->second - lo) / (hi - lo) : 0.5;
      o += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
          "stroke=\"#fff\"/>\n",
          x, y, cw, ch, has ? viridis(t) : "#e5e7eb");
      o += fmt::format(
          "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" dominant-baseline=\"middle\" "
          "style=\"fill:{}\">{}</text>\n",
          x + cw / 2, y + ch / 2, has && t < 0.6 ? "#fff" : "#111827",
          has ? report::fixed(it->second, 3) : "–");
    }
  }
  const double below = top + ch * static_cast<double>(rows.values.size());
  for (size_t c = 0; c < cols.values.size(); ++c)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     left + cw * (static_cast<double>(c) + 0.5), below + 16, html_escape(cols.values[c]));
  o += fmt::format(
      "<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{} (darker: lower loss; mean "
      "over "
      "the other keys and seeds)</text>\n</svg>\n",
      left + (width - left - right) / 2, below + 40, html_escape(col_key));
  return o;
}

/// Final val loss against log10 size per group, with each group's fitted curve.
report::line_chart fit_chart(const scaling_fits& f) {
  report::line_chart c;
  const bool params = f.size_key == "params";
  c.title = "Scaling fits: L(N) = A·N^-alpha + E";
  c.x_label = params ? "log10 N (parameters)" : "log10 " + f.size_key;
  c.y_label = "final val loss";
  for (size_t i = 0; i < f.sizes.size(); ++i) {
    const auto& g = f.sizes[i];
    report::series data(g.group.empty() ? "points" : g.group, report::color(i));
    data.markers = true, data.width = 0;
    for (size_t k = 0; k < g.x.size(); ++k) data.points.push_back({std::log10(g.x[k]), g.y[k]});
    c.lines.push_back(std::move(data));
    if (!g.fit.ok) continue;
    report::series curve("", report::color(i));
    const auto [lo, hi] = std::minmax_element(g.x.begin(), g.x.end());
    for (int k = 0; k <= 60; ++k) {
      const double lx = std::log10(*lo) + (std::log10(*hi) - std::log10(*lo)) * k / 60.0;
      curve.points.push_back({lx, g.fit.at(std::pow(10.0, lx))});
    }
    c.lines.push_back(std::move(curve));
  }
  return c;
}

std::string figure(const report::line_chart& c, int id) {
  if (!report::has_data(c))
    return fmt::format("<div class=\"empty\"><b>{}</b>No finished point has data for this chart yet.</div>\n",
                       html_escape(c.title));
  return "<figure>\n" + report::render_svg(c, id) + "</figure>\n";
}

std::string fit_table(const scaling_fits& f) {
  std::string o =
      "<table><thead><tr><th>group</th><th>curve</th><th>A</th><th>alpha</th><th>E</th><th>rms residual</th>"
      "<th>points</th></tr></thead><tbody>\n";
  auto err = [](double v, double e) {
    return std::isfinite(e) ? fmt::format("{:.4g} ± {:.2g}", v, e) : fmt::format("{:.4g}", v);
  };
  for (const auto* list : {&f.sizes, &f.tokens})
    for (const auto& g : *list) {
      const std::string curve = g.x_name == "D" ? "L(D) at " + g.size : "L(N), N = " + g.x_name;
      if (!g.fit.ok) {
        o += fmt::format(
            "<tr><th>{}</th><td>{}</td><td colspan=\"5\" class=\"warn\">not fitted: {}</td></tr>\n",
            html_escape(g.group), html_escape(curve), html_escape(g.fit.problem));
        continue;
      }
      o += fmt::format(
          "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3g}</td><td>{}</td></tr>\n",
          html_escape(g.group), html_escape(curve), err(g.fit.a, g.fit.a_err),
          err(g.fit.alpha, g.fit.alpha_err), err(g.fit.e, g.fit.e_err), g.fit.rms, g.fit.n);
    }
  return o + "</tbody></table>\n";
}

std::string results_table(const sweep_spec& s, const std::vector<point_result>& results) {
  std::string o = "<div class=\"wide\"><table><thead><tr><th>#</th><th>id</th>";
  for (const auto& k : s.keys) o += "<th>" + html_escape(k) + "</th>";
  o += "<th>seed</th><th>status</th><th>val loss</th><th>val ppl</th><th>tokens</th><th>wall</th>"
       "<th>bytes sent</th><th>utilization</th><th>parameters</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < s.points.size(); ++i) {
    const auto& p = s.points[i];
    const auto& r = results[i];
    o += fmt::format("<tr><th>{}</th><td>{}</td>", i + 1, html_escape(p.id));
    for (const auto& k : s.keys) o += "<td>" + html_escape(p.value_of(k)) + "</td>";
    // An exit code below 0 is none known (a point that never started: its folder could not be moved aside).
    const std::string status =
        r.status == "failed" && r.exit_code >= 0 ? fmt::format("failed (exit {})", r.exit_code) : r.status;
    o += fmt::format(
        "<td>{}</td><td "
        "class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        p.seed, r.status == "done" ? "ok" : "warn", html_escape(status), report::fixed(r.val_loss, 4),
        report::fixed(r.val_ppl, 3), std::isfinite(r.tokens) ? report::with_commas(r.tokens) : "–",
        html_escape(report::duration_text(r.wall_s)), html_escape(report::bytes_short(r.bytes_sent)),
        std::isfinite(r.utilization) ? report::fixed(r.utilization * 100, 1) + " %" : "–",
        std::isfinite(r.params) ? report::with_commas(r.params) : "–");
  }
  return o + "</tbody></table></div>\n";
}

std::string cards(const sweep_spec& s, const std::vector<point_result>& results) {
  size_t done = 0, failed = 0, best = s.points.size();
  double wall = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    done += results[i].status == "done";
    failed += results[i].status == "failed";
    if (std::isfinite(results[i].wall_s)) wall += results[i].wall_s;
    if (finished(results[i]) && (best == s.points.size() || results[i].val_loss < results[best].val_loss))
      best = i;
  }
  auto card = [](const std::string& k, const std::string& v, const char* cls = "") {
    return fmt::format("<div class=\"card\"><div class=\"k\">{}</div><div class=\"v {}\">{}</div></div>\n", k,
                       cls, html_escape(v));
  };
  std::string o = "<section class=\"cards\">\n";
  o += card("points done", fmt::format("{} of {}", done, s.points.size()),
            done == s.points.size() ? "ok" : "");
  o += card("failed", fmt::format("{}", failed), failed ? "warn" : "");
  o += card("best val loss", best < s.points.size() ? report::fixed(results[best].val_loss, 4) : "–");
  o += card("best point", best < s.points.size() ? s.points[best].label(s.has_repeats) : "–", "long");
  o += card("training time (sum)", report::duration_text(wall));
  return o + "</section>\n";
}

}  // namespace

std::string sweep_page(const sweep_spec& s, const std::vector<point_result>& results,
                       const scaling_fits& fits) {
  const std::string name = std::filesystem::path(s.path).stem().string();
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  o += fmt::format("<title>Longwave sweep: {}</title>\n<style>{}{}</style>\n</head>\n<body>\n<main>\n",
                   html_escape(name), report::page_css(), sweep_css);
  o += fmt::format(
      "<h1>Longwave sweep: {}</h1>\n<p class=\"sub\">{} &middot; base {} &middot; {} points</p>\n",
      html_escape(name), html_escape(s.out_dir), html_escape(s.base), s.points.size());
  o += cards(s, results);
  o += "<h2>Charts</h2>\n<section class=\"charts\">\n";
  int id = 0;
  const auto keys = chart_keys(s);
  for (const auto& k : keys) o += figure(loss_against(s, results, k, keys), ++id);
  o += figure(curves(s, results, true), ++id);
  o += figure(curves(s, results, false), ++id);
  if (keys.size() >= 2)
    o += "<figure>\n" + heat_map(s, results, keys[0].key, keys[1].key, ++id) + "</figure>\n";
  if (!fits.sizes.empty()) o += figure(fit_chart(fits), ++id);
  o += "</section>\n";
  if (!fits.sizes.empty()) o += "<h2>Scaling-law fits</h2>\n" + fit_table(fits);
  o += "<h2>Points</h2>\n" + results_table(s, results);
  o += fmt::format(
      "<footer><div>{} · results.csv, results.jsonl{}</div><div>generated by longwave sweep, {}</div>"
      "</footer>\n</main>\n</body>\n</html>\n",
      html_escape(s.path), fits.sizes.empty() ? "" : ", fit.json",
      report::utc_text(static_cast<double>(std::time(nullptr))));
  return o;
}

}  // namespace longwave::cli::sweep
