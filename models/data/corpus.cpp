// Corpus reading: plain files as raw bytes, .jsonl files as the string field "text" of one JSON object per
// line.
#include "models/data/corpus.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "models/data/file_io.hpp"
#include "runtime/errors.hpp"

namespace longwave::models::data {

namespace {

constexpr int max_depth = 256;  // deeper nesting is refused rather than risking the stack

// A cursor over one line of JSON; every failure is a std::invalid_argument naming the column.
class json_cursor {
 public:
  explicit json_cursor(std::string_view s) : s_(s) {}

  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }

  void skip_ws() {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(fmt::format("malformed JSON at column {}: {}", i_ + 1, what));
  }

  void expect(char c) {
    skip_ws();
    if (at_end()) fail(fmt::format("expected '{}' but the line ended", c));
    if (s_[i_] != c) fail(fmt::format("expected '{}' but found '{}'", c, s_[i_]));
    ++i_;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (at_end()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': append_utf8(out, parse_code_point()); break;
        default:
          --i_;  // point the column at the bad escape letter
          fail(fmt::format("unknown escape '\\{}'", e));
      }
    }
  }

  void skip_value(int depth) {
    if (depth > max_depth) fail("nested too deeply");
    skip_ws();
    if (at_end()) fail("expected a value but the line ended");
    char c = s_[i_];
    if (c == '"') {
      parse_string();
    } else if (c == '{') {
      ++i_;
      skip_ws();
      if (peek() == '}') {
        ++i_;
        return;
      }
      for (;;) {
        skip_ws();
        parse_string();
        expect(':');
        skip_value(depth + 1);
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return;
      }
    } else if (c == '[') {
      ++i_;
      skip_ws();
      if (peek() == ']') {
        ++i_;
        return;
      }
      for (;;) {
        skip_value(depth + 1);
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return;
      }
    } else if (c == 't') {
      literal("true");
    } else if (c == 'f') {
      literal("false");
    } else if (c == 'n') {
      literal("null");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = i_;
      while (!at_end() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                           s_[i_] == '+' || s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) {
        ++i_;
      }
      if (i_ == start + 1 && c == '-') fail("'-' without digits");
    } else {
      fail(fmt::format("unexpected character '{}'", c));
    }
  }

 private:
  void literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) fail(fmt::format("expected '{}'", word));
    i_ += word.size();
  }

  uint32_t parse_hex4() {
    if (s_.size() - i_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail(fmt::format("bad hex digit '{}' in \\u escape", h));
      }
      ++i_;
    }
    return v;
  }

  // After "\u": one code point, joining a surrogate pair when the low half follows.
  uint32_t parse_code_point() {
    uint32_t cp = parse_hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) return 0xFFFD;  // lone low surrogate
    if (cp < 0xD800 || cp > 0xDBFF) return cp;
    if (s_.substr(i_, 2) == "\\u") {
      size_t save = i_;
      i_ += 2;
      uint32_t lo = parse_hex4();
      if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      i_ = save;  // not a low half: decode it on its own next time round
    }
    return 0xFFFD;  // lone high surrogate
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

bool ends_with_jsonl(const std::string& path) {
  constexpr std::string_view ext = ".jsonl";
  if (path.size() < ext.size()) return false;
  return std::equal(ext.begin(), ext.end(), path.end() - static_cast<std::ptrdiff_t>(ext.size()),
                    [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
}

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

}  // namespace

std::optional<std::string> json_string_field(std::string_view line, std::string_view key) {
  json_cursor cur(line);
  std::optional<std::string> found;
  cur.expect('{');
  cur.skip_ws();
  if (cur.peek() == '}') {
    cur.expect('}');
  } else {
    for (;;) {
      cur.skip_ws();
      std::string name = cur.parse_string();
      cur.expect(':');
      cur.skip_ws();
      if (name == key && !found) {
        if (cur.peek() != '"') cur.fail(fmt::format("field \"{}\" is not a string", key));
        found = cur.parse_string();
      } else {
        cur.skip_value(1);
      }
      cur.skip_ws();
      if (cur.peek() == ',') {
        cur.expect(',');
        continue;
      }
      cur.expect('}');
      break;
    }
  }
  cur.skip_ws();
  if (!cur.at_end()) cur.fail("unexpected text after the object");
  return found;
}

std::string read_corpus(const std::string& path) {
  std::string bytes = read_file(path, "corpus");
  if (!ends_with_jsonl(path)) {
    if (bytes.empty()) throw lw_error(errc::corrupt_data, fmt::format("corpus '{}' is empty", path));
    return bytes;
  }
  std::string text;
  std::string_view rest(bytes);
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);  // UTF-8 byte-order mark
  int64_t line_no = 0;
  int64_t n_docs = 0;
  while (!rest.empty()) {
    ++line_no;
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (is_blank(line)) continue;
    std::optional<std::string> doc;
    try {
      doc = json_string_field(line, "text");
    } catch (const std::invalid_argument& e) {
      throw lw_error(errc::corrupt_data, fmt::format("corpus {}:{}: {}", path, line_no, e.what()));
    }
    if (!doc) {
      throw lw_error(errc::corrupt_data,
                     fmt::format("corpus {}:{}: object has no string field \"text\"", path, line_no));
    }
    if (doc->empty()) continue;
    if (n_docs++ > 0) text += "\n\n";
    text += *doc;
  }
  if (text.empty()) {
    throw lw_error(errc::corrupt_data,
                   fmt::format("corpus '{}' is empty: no non-empty \"text\" documents", path));
  }
  return text;
}

}  // namespace longwave::models::data
