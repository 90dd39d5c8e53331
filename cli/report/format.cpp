// Text forms of the report's numbers, and its line colors.
#include "cli/report/format.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <iterator>

namespace longwave::cli::report {
namespace {

// matplotlib's tab10: distinct, readable on white.
const char* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
static_assert(std::size(palette) == n_palette_colors);

}  // namespace

std::string color(size_t i) {
  return palette[i % std::size(palette)];
}

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
  if (!std::isfinite(v)) return "–";
  return std::abs(v) >= 1e9 ? fmt::format("{:.4g}", v) : fmt::format("{:.{}f}", v, decimals);
}

std::string with_commas(double v) {
  std::string s = fmt::format("{:.0f}", v);
  for (int i = static_cast<int>(s.size()) - 3; i > (s[0] == '-' ? 1 : 0); i -= 3)
    s.insert(static_cast<size_t>(i), ",");
  return s;
}

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
  if (s < 59.95) return fmt::format("{:.1f} s", s);  // a negative span (a clock set back) as it is
  if (s >= 1e9) return fmt::format("{:.3g} s", s);   // beyond any run (a bad ts): no lround overflow
  const long t = std::lround(s);
  if (t < 3600) return fmt::format("{}m {:02}s", t / 60, t % 60);
  return fmt::format("{}h {:02}m {:02}s", t / 3600, t / 60 % 60, t % 60);
}

std::string utc_text(double ts) {
  if (!std::isfinite(ts) || std::abs(ts) >= 1e15) return "–";  // past time_t's and gmtime's years
  const std::time_t t = static_cast<std::time_t>(ts);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace longwave::cli::report
