// The one parse of TOML text (config/toml_types.hpp), guarded against keys of very many dotted parts.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/toml_types.hpp"

namespace longwave::config {
namespace {

constexpr size_t max_key_parts = 64;  // the schema's deepest key has 2; a cluster file's 3

/// The line of the first key (or [table] header) of more than max_parts dotted parts. A light scan: strings
/// and comments are skipped, and dots count only in keys, not in values (numbers, dates); what it misreads
/// in malformed text toml::parse reports.
std::optional<uint32_t> line_of_deep_key(std::string_view t, size_t max_parts) {
  std::vector<char> open;  // '{': an inline table, '[': an array
  bool key = true;         // in a key or a header, where dots separate parts
  size_t parts = 1;
  uint32_t line = 1;
  for (size_t i = 0; i < t.size(); ++i) {
    const char ch = t[i];
    if (ch == '\n') {
      ++line;
      if (open.empty()) key = true, parts = 1;
    } else if (ch == '#') {
      while (i + 1 < t.size() && t[i + 1] != '\n') ++i;
    } else if (ch == '"' || ch == '\'') {
      const std::string close(t.compare(i, 3, std::string(3, ch)) == 0 ? 3 : 1, ch);
      size_t j = i + close.size();
      for (; j < t.size() && t.compare(j, close.size(), close) != 0; ++j) {
        if (ch == '"' && t[j] == '\\' && j + 1 < t.size()) ++j;  // an escape, perhaps of a line break
        if (t[j] == '\n') ++line;
      }
      // A multi-line string may end in one or two quotes of its own before its closing three.
      for (int extra = 0; close.size() == 3 && extra < 2 && j + 3 < t.size() && t[j + 3] == ch; ++extra) ++j;
      i = j + close.size() - 1;
    } else if (key) {
      if (ch == '.' && ++parts > max_parts) return line;
      if (ch == '=' || ch == ']') key = false, parts = 1;  // a value follows; or a header ended
      if (ch == '}' && !open.empty()) open.pop_back(), key = false;
    } else if (ch == '[') {
      open.push_back(ch);
    } else if (ch == '{') {
      open.push_back(ch), key = true, parts = 1;
    } else if ((ch == ']' || ch == '}') && !open.empty()) {
      open.pop_back();
    } else if (ch == ',' && !open.empty() && open.back() == '{') {
      key = true, parts = 1;
    }
  }
  return std::nullopt;
}

}  // namespace

bool is_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned c = *p++;
    if (c < 0x80) continue;
    // The continuation bytes a lead byte wants, and the range its first one must fall in (Unicode 3-7).
    int more = 0;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
      more = 1;
    else if (c == 0xe0)
      more = 2, lo = 0xa0;
    else if (c == 0xed)
      more = 2, hi = 0x9f;
    else if (c >= 0xe1 && c <= 0xef)
      more = 2;
    else if (c == 0xf0)
      more = 3, lo = 0x90;
    else if (c == 0xf4)
      more = 3, hi = 0x8f;
    else if (c >= 0xf1 && c <= 0xf3)
      more = 3;
    else
      return false;
    if (end - p < more || *p < lo || *p > hi) return false;
    for (++p; --more > 0; ++p)
      if (*p < 0x80 || *p > 0xbf) return false;
  }
  return true;
}

toml::table parse_toml(std::string_view text, std::string_view source) {
  if (const auto line = line_of_deep_key(text, max_key_parts)) {
    const auto what = fmt::format("a key of more than {} dotted parts", max_key_parts);
    throw toml::parse_error(what.c_str(), toml::source_position{*line, 1},
                            std::make_shared<const std::string>(source));
  }
  return toml::parse(text, source);
}

}  // namespace longwave::config
