// RapidJSON with Python's leniencies: NaN/Infinity numbers, and lone surrogate escapes read as U+FFFD.
#include "runtime/json/json_reader.hpp"

#include <rapidjson/error/en.h>

namespace longwave::runtime {

namespace {

// Iterative: a line of 100,000 '[' fails with an error instead of overflowing the stack.
constexpr unsigned parse_flags = rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag;

bool hex4(std::string_view s, size_t at, unsigned& cp) {
  if (s.size() < at + 4) return false;
  cp = 0;
  for (size_t k = at; k < at + 4; ++k) {
    const char c = s[k];
    const int h = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (h < 0) return false;
    cp = cp * 16 + static_cast<unsigned>(h);
  }
  return true;
}

// RapidJSON refuses a high surrogate escape without its low half and stores a lone low one as bytes that are
// not UTF-8. Python writes both for undecodable input; here each becomes \ufffd (same length: offsets hold).
std::optional<std::string> replace_lone_surrogates(std::string_view s) {
  std::optional<std::string> out;
  size_t copied = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] != '\\') continue;
    unsigned cp = 0;
    if (s[i + 1] != 'u' || !hex4(s, i + 2, cp)) {  // another escape (or a bad one: RapidJSON names it)
      ++i;
      continue;
    }
    unsigned low = 0;
    const bool high = cp >= 0xD800 && cp < 0xDC00;
    if (high && s.substr(i + 6, 2) == "\\u" && hex4(s, i + 8, low) && low >= 0xDC00 && low < 0xE000) {
      i += 11;  // a pair
      continue;
    }
    if (high || (cp >= 0xDC00 && cp < 0xE000)) {
      if (!out) out.emplace();
      out->append(s.substr(copied, i - copied)).append("\\ufffd");
      copied = i + 6;
    }
    i += 5;
  }
  if (out) out->append(s.substr(copied));
  return out;
}

// RapidJSON 1.1.0's full precision passes 0 to __builtin_clzll for a zero written with many digits or an
// exponent ("0.000...0", "0e100"; Tencent/rapidjson#1249, fixed after 1.1.0) and reads garbage (0e100 as
// -2e235). Each such zero outside a string becomes "0.0" or "-0.0" padded with spaces: the same value and
// kind, and the same length, so error offsets hold.
std::optional<std::string> plain_zeros(std::string_view s) {
  std::optional<std::string> out;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) continue;
    // A number token, read by JSON's grammar: -?int(.digits)?([eE][+-]?digits)?. Only a valid zero other
    // than 0 or -0 (int "0", every fraction digit 0, and a fraction or an exponent) is rewritten.
    auto digits = [&](size_t at, bool& all_zero) {
      size_t k = at;
      for (; k < s.size() && s[k] >= '0' && s[k] <= '9'; ++k) all_zero = all_zero && s[k] == '0';
      return k;
    };
    bool zero = true, valid = true, plain = true;
    size_t j = i + (c == '-');
    const size_t int_end = digits(j, zero);
    valid = int_end == j + 1 && s[j] == '0';  // a zero's integer part is one 0 (JSON has no leading zeros)
    j = int_end;
    if (j < s.size() && s[j] == '.') {
      const size_t frac_end = digits(j + 1, zero);
      valid = valid && frac_end > j + 1;
      j = frac_end;
      plain = false;
    }
    if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
      size_t k = j + 1;
      if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
      bool ignored = true;
      const size_t exp_end = digits(k, ignored);
      valid = valid && exp_end > k;
      j = exp_end;
      plain = false;
    }
    const std::string_view zero_text = c == '-' ? "-0.0" : "0.0";
    if (zero && valid && !plain && j - i > zero_text.size()) {
      if (!out) out.emplace(s);
      out->replace(i, j - i, std::string(zero_text) + std::string(j - i - zero_text.size(), ' '));
    }
    i = j == i ? i : j - 1;
  }
  return out;
}

}  // namespace

std::optional<json_error> parse_json(std::string_view text, rapidjson::Document& doc, json_numbers numbers) {
  auto replaced = replace_lone_surrogates(text);
  std::string_view parsed = replaced ? std::string_view(*replaced) : text;
  if (numbers == json_numbers::exact) {
    if (auto zeros = plain_zeros(parsed)) {
      replaced = std::move(zeros);
      parsed = *replaced;
    }
    doc.Parse<parse_flags | rapidjson::kParseFullPrecisionFlag>(parsed.data(), parsed.size());
  } else {
    doc.Parse<parse_flags>(parsed.data(), parsed.size());
  }
  json_error e;
  if (doc.HasParseError()) {
    e.what = rapidjson::GetParseError_En(doc.GetParseError());
    if (!e.what.empty() && e.what.back() == '.') e.what.pop_back();  // it goes inside a sentence
    e.offset = doc.GetErrorOffset();
    // Most errors of a cut text are at its end; a cut escape is reported at its backslash.
    const auto code = doc.GetParseError();
    const bool escape = code == rapidjson::kParseErrorStringEscapeInvalid ||
                        code == rapidjson::kParseErrorStringUnicodeEscapeInvalidHex ||
                        code == rapidjson::kParseErrorStringUnicodeSurrogateInvalid;
    e.truncated = e.offset >= text.size() || (escape && text.size() - e.offset < 12 &&
                                              text.find('"', e.offset) == std::string_view::npos);
  } else if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    e.what = "A NUL byte after the value";  // RapidJSON's streams end at a NUL
    e.offset = nul;
  } else {
    return std::nullopt;
  }
  for (size_t k = 0; k < e.offset && k < text.size(); ++k) {
    if (text[k] == '\n') {
      ++e.line;
      e.column = 1;
    } else {
      ++e.column;
    }
  }
  return e;
}

const rapidjson::Value* find_member(const rapidjson::Value& v, std::string_view key) {
  if (!v.IsObject()) return nullptr;
  const rapidjson::Value* found = nullptr;
  for (const auto& m : v.GetObject())
    if (std::string_view(m.name.GetString(), m.name.GetStringLength()) == key) found = &m.value;
  return found;
}

}  // namespace longwave::runtime
