#pragma once
// Test helpers: a parser for the Prometheus text exposition format (0.0.4) and a plain HTTP GET.
#include <httplib.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace longwave::test {

/// One sample line: name{labels} value.
struct prom_sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

namespace detail {

inline bool is_blank(char c) {
  return c == ' ' || c == '\t';
}

inline double parse_prom_value(const std::string& tok, const std::string& line) {
  if (tok == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (tok == "+Inf" || tok == "Inf") return std::numeric_limits<double>::infinity();
  if (tok == "-Inf") return -std::numeric_limits<double>::infinity();
  char* end = nullptr;
  double v = std::strtod(tok.c_str(), &end);
  if (tok.empty() || end != tok.c_str() + tok.size())
    throw std::runtime_error("prom_text: bad value in: " + line);
  return v;
}

}  // namespace detail

/// Parses every sample line; skips blank lines and # comments (HELP, TYPE). Throws std::runtime_error naming
/// the line on malformed input.
inline std::vector<prom_sample> parse_prom_text(const std::string& text) {
  std::vector<prom_sample> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;

    size_t i = 0;
    while (i < line.size() && detail::is_blank(line[i])) ++i;
    if (i == line.size() || line[i] == '#') continue;
    auto fail = [&](const char* what) {
      throw std::runtime_error(std::string("prom_text: ") + what + " in: " + line);
    };

    prom_sample s;
    while (i < line.size() && line[i] != '{' && !detail::is_blank(line[i])) s.name += line[i++];
    if (s.name.empty()) fail("missing metric name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        while (i < line.size() && (detail::is_blank(line[i]) || line[i] == ',')) ++i;
        if (i >= line.size()) fail("unterminated label set");
        if (line[i] == '}') {
          ++i;
          break;
        }
        std::string key;
        while (i < line.size() && line[i] != '=' && !detail::is_blank(line[i])) key += line[i++];
        while (i < line.size() && detail::is_blank(line[i])) ++i;
        if (key.empty() || i >= line.size() || line[i] != '=') fail("bad label name");
        ++i;
        while (i < line.size() && detail::is_blank(line[i])) ++i;
        if (i >= line.size() || line[i] != '"') fail("label value without quotes");
        ++i;
        std::string value;
        for (;;) {
          if (i >= line.size()) fail("unterminated label value");
          char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) fail("dangling escape");
            char e = line[i++];
            value += e == 'n' ? '\n' : e;  // \\ -> \, \" -> ", \n -> newline
          } else {
            value += c;
          }
        }
        s.labels[key] = value;
      }
    }
    while (i < line.size() && detail::is_blank(line[i])) ++i;
    std::string tok;
    while (i < line.size() && !detail::is_blank(line[i]) && line[i] != '\r') tok += line[i++];
    if (tok.empty()) fail("missing value");
    s.value = detail::parse_prom_value(tok, line);
    out.push_back(std::move(s));  // an optional timestamp after the value is ignored
  }
  return out;
}

/// The value of the sample called `name` whose label set equals `labels` exactly, or std::nullopt.
inline std::optional<double> prom_value(const std::vector<prom_sample>& samples, const std::string& name,
                                        const std::map<std::string, std::string>& labels = {}) {
  for (const auto& s : samples)
    if (s.name == name && s.labels == labels) return s.value;
  return std::nullopt;
}

/// The value of the sample called `name` whose labels include `labels` (others, such as node, may be there
/// too), or std::nullopt.
inline std::optional<double> prom_find(const std::vector<prom_sample>& samples, const std::string& name,
                                       const std::map<std::string, std::string>& labels = {}) {
  for (const auto& s : samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      const auto it = s.labels.find(k);
      all = all && it != s.labels.end() && it->second == v;
    }
    if (all) return s.value;
  }
  return std::nullopt;
}

/// GET http://127.0.0.1:<port><path>; returns the body of a 200 response and throws std::runtime_error
/// otherwise.
inline std::string http_get(int port, const std::string& path) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(10);
  auto res = cli.Get(path);
  if (!res)
    throw std::runtime_error("GET 127.0.0.1:" + std::to_string(port) + path +
                             " failed: " + httplib::to_string(res.error()));
  if (res->status != 200)
    throw std::runtime_error("GET 127.0.0.1:" + std::to_string(port) + path + " returned HTTP " +
                             std::to_string(res->status));
  return res->body;
}

}  // namespace longwave::test
