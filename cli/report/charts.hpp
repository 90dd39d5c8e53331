#pragma once
// An SVG line-chart builder for `longwave report`: charts of (x, y) series rendered as inline <svg> elements,
// with ticks at round numbers, a legend, resume marks and gaps where a point is not finite.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace longwave::cli::report {

/// `s` with &, <, >, " and ' escaped for HTML text and attribute values.
std::string html_escape(std::string_view s);

/// A point of a series; one that is not finite ends a segment of the line.
struct point {
  double x, y;
};

/// One line of a chart.
struct series {
  series(std::string name_, std::string color_) : name(std::move(name_)), color(std::move(color_)) {}
  series() = default;
  std::string name;  // legend label; empty: not in the legend
  std::string color;
  std::vector<point> points;
  bool dashed = false;
  bool markers = false;  // a dot at every point
  double opacity = 1.0;
  double width = 2.0;
};

/// A chart: its lines, labels and axis options.
struct line_chart {
  std::string title, x_label, y_label;
  std::vector<series> lines;
  std::vector<double> x_marks;  // vertical dashed lines where a run was resumed
  bool x_integer = false;       // rounds: integer ticks only
  bool x_from_zero = false, y_from_zero = false;
  std::optional<std::pair<double, double>> y_range;  // fixed y range (percentages)
};

/// Whether any line holds a point whose x and y are both finite.
bool has_data(const line_chart& c);

/// Renders a chart as an inline <svg class="chart">: title, light grid, axes with tick labels, axis labels,
/// the lines (clipped to the plot), resume marks, and a legend below when more than one line is named.
std::string render_svg(const line_chart& c, int id);

}  // namespace longwave::cli::report
