#pragma once
// Test helper: a small, strict JSON reader (RFC 8259) for dashboard files and Prometheus API answers. No
// JSON library is among the project's Debian packages, and tests only need to read.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace longwave::test {

/// One JSON value. Objects keep their keys sorted (std::map); duplicate keys are an error.
struct json {
  enum class kind { null, boolean, number, string, array, object };

  kind type = kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<json> arr;
  std::map<std::string, json> obj;

  bool is_null() const { return type == kind::null; }
  bool is_bool() const { return type == kind::boolean; }
  bool is_number() const { return type == kind::number; }
  bool is_string() const { return type == kind::string; }
  bool is_array() const { return type == kind::array; }
  bool is_object() const { return type == kind::object; }

  /// Whether this is an object with member `key`.
  bool has(const std::string& key) const { return is_object() && obj.count(key) > 0; }

  /// The member `key` of an object; throws std::runtime_error if this is not an object or lacks it.
  const json& at(const std::string& key) const {
    if (!is_object()) throw std::runtime_error("json: not an object, looking for \"" + key + "\"");
    auto it = obj.find(key);
    if (it == obj.end()) throw std::runtime_error("json: no member \"" + key + "\"");
    return it->second;
  }
};

namespace detail {

class json_reader {
 public:
  explicit json_reader(const std::string& text) : s_(text) {}

  json document() {
    json v = value(0);
    skip_space();
    if (i_ != s_.size()) fail("trailing characters after the value");
    return v;
  }

 private:
  static constexpr int max_depth = 256;

  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw std::runtime_error("json: " + what + " at line " + std::to_string(line) + ", column " +
                             std::to_string(col));
  }

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }

  bool literal(const char* word) {
    size_t n = 0;
    while (word[n]) ++n;
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  json value(int depth) {
    if (depth > max_depth) fail("nesting too deep");
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end of input");
    json v;
    const char c = s_[i_];
    if (c == '{') {
      v.type = json::kind::object;
      ++i_;
      skip_space();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      for (;;) {
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a member name");
        std::string key = string_body();
        skip_space();
        if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':'");
        ++i_;
        if (v.obj.count(key)) fail("duplicate member \"" + key + "\"");
        v.obj.emplace(std::move(key), value(depth + 1));
        skip_space();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type = json::kind::array;
      ++i_;
      skip_space();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      for (;;) {
        v.arr.push_back(value(depth + 1));
        skip_space();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type = json::kind::string;
      v.str = string_body();
      return v;
    }
    if (literal("true")) {
      v.type = json::kind::boolean;
      v.b = true;
      return v;
    }
    if (literal("false")) {
      v.type = json::kind::boolean;
      return v;
    }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = json::kind::number;
      v.num = number();
      return v;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  double number() {
    const size_t start = i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > from;
    };
    if (s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (!digits()) {
      fail("bad number");
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) fail("bad number: no digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) fail("bad number: no exponent digits");
    }
    return std::strtod(s_.substr(start, i_ - start).c_str(), nullptr);
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') {
        cp |= unsigned(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        cp |= unsigned(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        cp |= unsigned(h - 'A' + 10);
      } else {
        fail("bad \\u escape");
      }
    }
    return cp;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // At the opening quote; returns the decoded text and leaves i_ after the closing quote.
  std::string string_body() {
    ++i_;
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') fail("lone high surrogate");
            i_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("lone low surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape \\") + e);
      }
    }
  }

  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace detail

/// Parses a whole JSON document; throws std::runtime_error naming the line and column of the first problem.
inline json parse_json(const std::string& text) {
  return detail::json_reader(text).document();
}

}  // namespace longwave::test
