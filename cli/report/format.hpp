#pragma once
// How the report writes numbers, sizes, durations and times, and the colors its lines take.
#include <cstddef>
#include <string>
#include <utility>

namespace longwave::cli::report {

/// Colors of the palette (matplotlib's tab10); lines past these are dashed.
inline constexpr size_t n_palette_colors = 10;

/// Palette color i (wrapping after n_palette_colors).
std::string color(size_t i);

/// `hex` (#rrggbb) with `t` in -1..1: darker toward black below 0, lighter toward white above.
std::string shade(const std::string& hex, double t);

/// The shortest form of v ("–" when it is not finite).
std::string compact(double v);

/// v with `decimals` decimals ("–" when it is not finite).
std::string fixed(double v, int decimals);

/// v rounded to an integer with thousands separators: 1,234,567.
std::string with_commas(double v);

/// The divisor and unit (decimal: 1 MB = 10^6 bytes) that suit a largest value of max_bytes.
std::pair<double, std::string> byte_unit(double max_bytes);

/// "1.50 MB (1,500,000 bytes)".
std::string bytes_text(double b);

/// "1.50 MB".
std::string bytes_short(double b);

/// "12.3 s", "4m 05s" or "1h 02m 03s".
std::string duration_text(double s);

/// A unix time as "YYYY-MM-DD HH:MM:SS UTC".
std::string utc_text(double ts);

}  // namespace longwave::cli::report
