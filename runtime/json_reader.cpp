// A recursive-descent JSON reader: one pass over the text, no exceptions inside; the first problem stops it.
#include "runtime/json_reader.hpp"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace longwave::runtime {

const json* json::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &it->second;
}

const json& json::at(std::string_view key) const {
  if (!is_object()) throw std::runtime_error("json: not an object, looking for \"" + std::string(key) + "\"");
  const json* v = find(key);
  if (!v) throw std::runtime_error("json: no member \"" + std::string(key) + "\"");
  return *v;
}

namespace {

std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

class reader {
 public:
  reader(std::string_view s, const json_options& o) : s_(s), o_(o) {}

  std::optional<json> document(json_error* error) {
    json v;
    bool ok = value(v, 0);
    if (ok) {
      skip_space();
      if (i_ != s_.size()) ok = fail("unexpected text after the value");
    }
    if (ok) return v;
    if (error) {
      *error = json_error{what_, at_, 1, 1, at_ >= s_.size()};
      for (size_t k = 0; k < at_ && k < s_.size(); ++k) {
        if (s_[k] == '\n') {
          ++error->line;
          error->column = 1;
        } else {
          ++error->column;
        }
      }
    }
    return std::nullopt;
  }

 private:
  bool fail(std::string what) {
    what_ = std::move(what);
    at_ = i_;
    return false;
  }
  bool at(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool eat(char c) {
    if (!at(c)) return false;
    ++i_;
    return true;
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  bool value(json& v, int depth) {
    if (depth > o_.max_depth) return fail("nesting too deep");
    skip_space();
    if (i_ >= s_.size()) return fail("expected a value");
    const char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.type = json::kind::string;
      return string_body(v.str);
    }
    if (literal("true")) {
      v.type = json::kind::boolean;
      v.b = true;
      return true;
    }
    if (literal("false")) {
      v.type = json::kind::boolean;
      return true;
    }
    if (literal("null")) return true;
    v.type = json::kind::number;
    if (o_.nonfinite_numbers && nonfinite(v.num)) return true;
    if (cut_word()) return fail("expected a value");
    if (c == '-' || (c >= '0' && c <= '9')) return number(v.num);
    return fail(std::string("unexpected character '") + c + "'");
  }

  bool object(json& v, int depth) {
    v.type = json::kind::object;
    ++i_;
    skip_space();
    if (eat('}')) return true;
    for (;;) {
      skip_space();
      if (!at('"')) return fail(i_ >= s_.size() ? "expected a member name" : "expected a quoted member name");
      std::string key;
      const size_t key_at = i_;
      if (!string_body(key)) return false;
      skip_space();
      if (!eat(':')) return fail("expected ':' after \"" + key + "\"");
      json member;
      if (!value(member, depth + 1)) return false;
      if (v.obj.count(key) && o_.strict) {
        i_ = key_at;
        return fail("duplicate member \"" + key + "\"");
      }
      v.obj[std::move(key)] = std::move(member);
      skip_space();
      if (eat(',')) continue;
      if (eat('}')) return true;
      return fail("expected ',' or '}'");
    }
  }

  bool array(json& v, int depth) {
    v.type = json::kind::array;
    ++i_;
    skip_space();
    if (eat(']')) return true;
    for (;;) {
      v.arr.emplace_back();
      if (!value(v.arr.back(), depth + 1)) return false;
      skip_space();
      if (eat(',')) continue;
      if (eat(']')) return true;
      return fail("expected ',' or ']'");
    }
  }

  // Whether the text ends inside a literal (a writer stopped mid-word); then i_ is at the end.
  bool cut_word() {
    if (s_.size() - i_ >= 9) return false;  // longer than every word
    const std::string_view rest = s_.substr(i_);
    auto cut = [&](std::string_view word, std::string_view text) {
      return text.size() < word.size() && word.substr(0, text.size()) == text;
    };
    bool found = cut("true", rest) || cut("false", rest) || cut("null", rest);
    if (!found && o_.nonfinite_numbers) {  // these in any case
      const std::string lower = ascii_lower(rest);
      for (std::string_view word : {"nan", "-nan", "infinity", "-infinity"})
        found = found || cut(word, lower);
    }
    if (found) i_ = s_.size();
    return found;
  }

  // nan, -nan, inf, -inf, infinity, -infinity in any case, not followed by more of a word.
  bool nonfinite(double& out) {
    size_t j = i_;
    const bool minus = j < s_.size() && s_[j] == '-';
    if (minus) ++j;
    size_t end = j;
    while (end < s_.size() && std::isalpha(static_cast<unsigned char>(s_[end]))) ++end;
    const std::string word = ascii_lower(s_.substr(j, end - j));
    if (word == "nan") {
      out = std::nan("");
    } else if (word == "inf" || word == "infinity") {
      out = minus ? -HUGE_VAL : HUGE_VAL;
    } else {
      return false;
    }
    i_ = end;
    return true;
  }

  bool number(double& out) {
    const size_t start = i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > from;
    };
    eat('-');
    if (!eat('0') && !digits()) return fail("bad number: expected a digit");
    if (eat('.') && !digits()) return fail("bad number: no digits after '.'");
    if (at('e') || at('E')) {
      ++i_;
      if (!eat('+')) eat('-');
      if (!digits()) return fail("bad number: no exponent digits");
    }
    out = std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
    return true;
  }

  bool hex4(uint32_t& cp) {
    cp = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      if (i_ >= s_.size()) return fail("truncated \\u escape");
      const int h = std::tolower(static_cast<unsigned char>(s_[i_]));
      if (!std::isxdigit(h)) return fail("bad \\u escape");
      cp = cp * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    return true;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // \uXXXX, at the 'u'; a high surrogate takes the low one that must follow.
  bool unicode_escape(std::string& out) {
    ++i_;
    uint32_t cp = 0;
    if (!hex4(cp)) return false;
    if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
      const size_t second = i_;
      i_ += 2;
      uint32_t low = 0;
      if (!hex4(low)) return false;
      if (low >= 0xDC00 && low < 0xE000) {
        put_utf8(out, 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00));
        return true;
      }
      if (o_.strict) return fail("bad low surrogate");
      i_ = second;  // not a low half: U+FFFD, and the second escape is read on its own
      cp = 0xFFFD;
    } else if (cp >= 0xD800 && cp < 0xE000) {
      if (cp < 0xDC00 && s_.size() - i_ < 2 &&
          std::string_view("\\u").substr(0, s_.size() - i_) == s_.substr(i_)) {
        i_ = s_.size();  // the text ends where the low half would start
        return fail("unterminated string");
      }
      if (o_.strict) return fail("lone surrogate");
      cp = 0xFFFD;
    }
    put_utf8(out, cp);
    return true;
  }

  // At the opening quote; leaves i_ after the closing one.
  bool string_body(std::string& out) {
    ++i_;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20 && o_.strict) return fail("control character in a string");
      ++i_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      switch (s_[i_]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u':
          if (!unicode_escape(out)) return false;
          continue;
        default: return fail(std::string("bad escape \\") + s_[i_]);
      }
      ++i_;
    }
    return fail("unterminated string");
  }

  std::string_view s_;
  const json_options& o_;
  size_t i_ = 0;
  std::string what_;
  size_t at_ = 0;
};

}  // namespace

std::optional<json> parse_json(std::string_view text, const json_options& options, json_error* error) {
  return reader(text, options).document(error);
}

}  // namespace longwave::runtime
