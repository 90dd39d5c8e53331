// The SVG line charts of `longwave report`: axes at round ticks, decimated long series, legend below.
#include "cli/report/charts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace longwave::cli::report {

namespace {

/// The length of the well-formed UTF-8 sequence at the start of `s` (1 to 4), or 0 when it is not one:
/// a stray continuation byte, a cut sequence, an overlong form, a surrogate or a code point past U+10FFFF.
size_t utf8_length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || c > 0xF4 || s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i)
    if ((b(i) & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && b(1) < 0xA0) || (c == 0xED && b(1) > 0x9F) || (c == 0xF0 && b(1) < 0x90) ||
      (c == 0xF4 && b(1) > 0x8F))
    return 0;
  return n;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const char c = s.front();
    const size_t n = utf8_length(s);
    if (n > 1) {
      out.append(s.data(), n);
    } else if (n == 0 || (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') || c == 0x7F) {
      out += "\xEF\xBF\xBD";  // U+FFFD for a byte that is not UTF-8 text: the page stays valid
    } else {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    s.remove_prefix(n == 0 ? 1 : n);
  }
  return out;
}

bool has_data(const line_chart& c) {
  for (const auto& s : c.lines)
    for (const auto& p : s.points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) return true;
  return false;
}

namespace {

struct axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};

// Ticks at 1, 2 or 5 times a power of ten; the range widens to whole ticks.
axis nice_axis(double lo, double hi, int n_ticks, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 0;
  if (!(hi > lo)) {  // one value: a band around it (wide enough to tell from it), or 0..1 for all zeros
    const double pad = std::max(integer ? 1.0 : 0.0, std::abs(lo) * 0.1);
    if (lo == 0) {
      hi = 1;
    } else {
      lo -= pad;
      hi += pad;
    }
  }
  const double raw = (hi - lo) / n_ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  axis a;
  a.step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integer) a.step = std::max(1.0, std::round(a.step));
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  if (!(a.hi > a.lo)) a.hi = a.lo + a.step;  // two values closer than their precision allows a step
  // At most a few more ticks than asked for, even where a step is below a value's precision (1e30 + 1).
  for (int k = 0; k <= 2 * n_ticks + 2 && a.lo + k * a.step <= a.hi + a.step * 1e-6; ++k) {
    const double t = a.lo + k * a.step;
    a.ticks.push_back(std::abs(t) < a.step * 1e-9 ? 0.0 : t);
  }
  return a;
}

std::string tick_label(double v, double step) {
  auto fixed = [](double x, double st) {
    const int decimals = st >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(st) - 1e-9)));
    return fmt::format("{:.{}f}", x, decimals);
  };
  if (v == 0) return "0";
  if (step >= 1e5) return fixed(v / 1e6, step / 1e6) + "M";
  if (step >= 1e3) return fixed(v / 1e3, step / 1e3) + "k";
  return fixed(v, step);
}

// Long series keep each bucket's first, min and max points, so the noise envelope survives.
std::vector<point> decimate(const std::vector<point>& pts, size_t max_points) {
  if (pts.size() <= max_points) return pts;
  const size_t buckets = max_points / 3, per = (pts.size() + buckets - 1) / buckets;
  std::vector<point> out;
  for (size_t b = 0; b < pts.size(); b += per) {
    const auto first = pts.begin() + static_cast<std::ptrdiff_t>(b);
    const auto last = pts.begin() + static_cast<std::ptrdiff_t>(std::min(pts.size(), b + per));
    auto [lo, hi] = std::minmax_element(first, last, [](point a, point c) { return a.y < c.y; });
    std::vector<point> keep{*first, *lo, *hi};
    std::sort(keep.begin(), keep.end(), [](point a, point c) { return a.x < c.x; });
    out.insert(out.end(), keep.begin(), keep.end());
  }
  return out;
}

// The chart's geometry in SVG user units: the plot area and the margins around it.
constexpr double width = 600, left = 64, right = 18, top = 42, plot_h = 230;
constexpr double plot_w = width - left - right, bottom = top + plot_h;

/// The axes of a chart, fitted to its finite points and its axis options, and the data-to-pixel mapping.
struct plot_frame {
  axis xa, ya;
  double px(double x) const { return left + (x - xa.lo) / (xa.hi - xa.lo) * plot_w; }
  double py(double y) const { return bottom - (y - ya.lo) / (ya.hi - ya.lo) * plot_h; }
};

plot_frame frame_of(const line_chart& c) {
  double x_lo = HUGE_VAL, x_hi = -HUGE_VAL, y_lo = HUGE_VAL, y_hi = -HUGE_VAL;
  for (const auto& s : c.lines)
    for (const auto& p : s.points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) {
        x_lo = std::min(x_lo, p.x), x_hi = std::max(x_hi, p.x);
        y_lo = std::min(y_lo, p.y), y_hi = std::max(y_hi, p.y);
      }
  if (c.x_from_zero) x_lo = std::min(x_lo, 0.0);
  if (c.y_from_zero) y_lo = std::min(y_lo, 0.0);
  if (c.y_range) y_lo = std::min(y_lo, c.y_range->first), y_hi = std::max(y_hi, c.y_range->second);
  return {nice_axis(x_lo, x_hi, 6, c.x_integer), nice_axis(y_lo, y_hi, 5, false)};
}

struct legend_item {
  const series* s;
  double x, y;
};

/// Legend rows, laid out by an estimate of the text width (about 6.6 px per character at 11 px); none
/// unless more than one line is named. Sets *height to the whole chart's height.
std::vector<legend_item> layout_legend(const line_chart& c, double* height) {
  std::vector<legend_item> legend;
  const size_t n_named =
      std::count_if(c.lines.begin(), c.lines.end(), [](auto& s) { return !s.name.empty(); });
  double lx = left, ly = bottom + 62;
  if (n_named > 1) {
    for (const auto& s : c.lines) {
      if (s.name.empty()) continue;
      const double w = 30 + 6.6 * static_cast<double>(s.name.size()) + 18;
      if (lx + w > width - right && lx > left) lx = left, ly += 18;
      legend.push_back({&s, lx, ly});
      lx += w;
    }
  }
  *height = legend.empty() ? bottom + 50 : ly + 14;
  return legend;
}

/// The <svg> element's start: its size, accessible title, the plot's clip path and the visible title.
std::string svg_start(const line_chart& c, int id, double height) {
  std::string o;
  const std::string title = html_escape(c.title);
  o += fmt::format(
      "<svg class=\"chart\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-labelledby=\"chart{}-title\">\n",
      width, height, width, height, id);
  o += fmt::format("<title id=\"chart{}-title\">{}</title>\n", id, title);
  o += fmt::format(
      "<defs><clipPath id=\"chart{}-clip\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath>"
      "</defs>\n",
      id, left - 4, top - 4, plot_w + 8, plot_h + 8);
  o += fmt::format("<text class=\"title\" x=\"{}\" y=\"24\">{}</text>\n", left - 52, title);
  return o;
}

/// Grid, axis lines, tick labels and axis labels.
std::string svg_axes(const line_chart& c, const plot_frame& f) {
  std::string o = "<g class=\"grid\" stroke=\"#e5e7eb\" stroke-width=\"1\">\n";
  for (double t : f.xa.ticks)
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", f.px(t), top, bottom);
  for (double t : f.ya.ticks)
    o += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"/>\n", f.py(t), left,
                     left + plot_w);
  o += "</g>\n";
  o += fmt::format(
      "<g stroke=\"#9ca3af\" stroke-width=\"1\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>", left,
      bottom, left + plot_w);
  o += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/></g>\n", left, top, bottom);
  o += "<g class=\"ticks\">\n";
  for (double t : f.xa.ticks)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", f.px(t), bottom + 16,
                     tick_label(t, f.xa.step));
  for (double t : f.ya.ticks)
    o += fmt::format(
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n", left - 7,
        f.py(t), tick_label(t, f.ya.step));
  o += "</g>\n";
  o += fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                   left + plot_w / 2, bottom + 38, html_escape(c.x_label));
  o += fmt::format(
      "<text class=\"label\" transform=\"translate(16 {:.1f}) rotate(-90)\" "
      "text-anchor=\"middle\">{}</text>\n",
      top + plot_h / 2, html_escape(c.y_label));
  return o;
}

std::string svg_resume_marks(const line_chart& c, const plot_frame& f) {
  std::string o;
  for (double x : c.x_marks) {
    if (!(x >= f.xa.lo && x <= f.xa.hi)) continue;
    o += fmt::format(
        "<g class=\"resume\"><line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#6b7280\" "
        "stroke-dasharray=\"4 3\"/><text x=\"{3:.1f}\" y=\"{4}\">resumed</text></g>\n",
        f.px(x), top, bottom, f.px(x) + 3, top + 10);
  }
  return o;
}

/// One series as polylines (decimated), with a dot per point if it asks for markers or has one point.
std::string svg_series(const series& s, const plot_frame& f) {
  // A point that is not finite ends a segment (a resumed run's downtime is not drawn as a line).
  std::vector<std::vector<point>> segments(1);
  size_t n_finite = 0;
  for (const auto& p : s.points) {
    if (std::isfinite(p.x) && std::isfinite(p.y)) {
      segments.back().push_back(p), ++n_finite;
    } else if (!segments.back().empty()) {
      segments.emplace_back();
    }
  }
  std::string o;
  for (const auto& segment : segments) {
    if (segment.empty()) continue;
    std::string pts;
    for (const auto& p : decimate(segment, 2400)) pts += fmt::format("{:.1f},{:.1f} ", f.px(p.x), f.py(p.y));
    pts.pop_back();
    o += fmt::format(
        "<polyline points=\"{}\" stroke=\"{}\" stroke-width=\"{}\" stroke-opacity=\"{}\" "
        "stroke-linejoin=\"round\" stroke-linecap=\"round\"{}/>\n",
        pts, s.color, s.width, s.opacity, s.dashed ? " stroke-dasharray=\"6 4\"" : "");
  }
  if (s.markers || n_finite == 1)
    for (const auto& segment : segments)
      for (const auto& p : segment)
        o += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.2\" fill=\"{}\" stroke=\"#fff\" "
            "stroke-width=\"1\"/>\n",
            f.px(p.x), f.py(p.y), s.color);
  return o;
}

std::string svg_legend(const std::vector<legend_item>& legend) {
  std::string o;
  for (const auto& item : legend) {
    o += fmt::format(
        "<g class=\"legend\"><line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" "
        "stroke=\"{3}\" "
        "stroke-width=\"2.5\"{4}/>",
        item.x, item.y - 4, item.x + 22, item.s->color, item.s->dashed ? " stroke-dasharray=\"5 3\"" : "");
    if (item.s->markers)
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>", item.x + 11, item.y - 4,
                       item.s->color);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text></g>\n", item.x + 28, item.y,
                     html_escape(item.s->name));
  }
  return o;
}

}  // namespace

std::string render_svg(const line_chart& c, int id) {
  const plot_frame f = frame_of(c);
  double height = 0;
  const auto legend = layout_legend(c, &height);
  std::string o = svg_start(c, id, height);
  o += svg_axes(c, f);
  // Resume marks, then the lines.
  o += svg_resume_marks(c, f);
  o += fmt::format("<g clip-path=\"url(#chart{}-clip)\" fill=\"none\">\n", id);
  for (const auto& s : c.lines) o += svg_series(s, f);
  o += "</g>\n";
  o += svg_legend(legend);
  o += "</svg>\n";
  return o;
}

}  // namespace longwave::cli::report
