// RapidJSON with Python's leniencies: NaN/Infinity numbers, and lone surrogate escapes read as U+FFFD.
#include "runtime/json/json_reader.hpp"

#include <rapidjson/encodedstream.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>

#include <locale.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdlib>

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

// Numbers are converted here, not by RapidJSON: its full precision (1.1.0) is unsafe on text from outside (it
// passes 0 to __builtin_clzll for "0e100", read as -2e235, and indexes past its table of powers for a number
// with hundreds of leading zeros; Tencent/rapidjson#1249 and others, fixed after 1.1.0), and its normal
// precision reads "NaN.5" as 0.5. RapidJSON checks the grammar and hands each number's text to strtod, which
// rounds correctly.
class exact_numbers : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, exact_numbers> {
 public:
  explicit exact_numbers(rapidjson::Document& doc) : doc_(doc) {}
  bool Default() { return false; }  // every event is forwarded below
  bool Null() { return doc_.Null(); }
  bool Bool(bool b) { return doc_.Bool(b); }
  bool String(const char* s, rapidjson::SizeType n, bool copy) { return doc_.String(s, n, copy); }
  bool Key(const char* s, rapidjson::SizeType n, bool copy) { return doc_.Key(s, n, copy); }
  bool StartObject() { return doc_.StartObject(); }
  bool EndObject(rapidjson::SizeType n) { return doc_.EndObject(n); }
  bool StartArray() { return doc_.StartArray(); }
  bool EndArray(rapidjson::SizeType n) { return doc_.EndArray(n); }
  // `s` ends with a NUL. An integer keeps its kind (as RapidJSON's own reading) unless it overflows 64 bits.
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    const std::string_view text(s, n);
    if (text.find_first_of("IN") != std::string_view::npos) {
      // RapidJSON's grammar lets a fraction or an exponent follow NaN and Infinity ("NaN.5"): not Python's.
      const auto word = text.substr(text.front() == '-' ? 1 : 0);
      if (word != "NaN" && word != "Inf" && word != "Infinity") return false;
    } else if (text.find_first_of(".eE") == std::string_view::npos) {
      errno = 0;
      char* end = nullptr;
      if (text.front() == '-') {
        const long long v = std::strtoll(s, &end, 10);
        if (errno == 0 && end == s + n) return doc_.Int64(v);
      } else {
        const unsigned long long v = std::strtoull(s, &end, 10);
        if (errno == 0 && end == s + n) return doc_.Uint64(v);
      }
    }
    static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", nullptr);  // '.' whatever the locale
    return doc_.Double(strtod_l(s, nullptr, c_locale));
  }

 private:
  rapidjson::Document& doc_;
};

rapidjson::ParseResult parse_exact(std::string_view text, rapidjson::Document& doc) {
  rapidjson::MemoryStream memory(text.data(), text.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(memory);
  rapidjson::Reader reader;
  rapidjson::ParseResult result;
  auto generate = [&](rapidjson::Document& d) {
    exact_numbers handler(d);
    result = reader.Parse<parse_flags | rapidjson::kParseNumbersAsStringsFlag>(in, handler);
    return !result.IsError();
  };
  doc.Populate(generate);
  return result;
}

}  // namespace

std::optional<json_error> parse_json(std::string_view text, rapidjson::Document& doc) {
  auto replaced = replace_lone_surrogates(text);
  const std::string_view parsed = replaced ? std::string_view(*replaced) : text;
  const rapidjson::ParseResult r = parse_exact(parsed, doc);
  json_error e;
  if (r.IsError()) {
    // The handler stops only at a NaN or Infinity with more after it.
    e.what = r.Code() == rapidjson::kParseErrorTermination
                 ? "Invalid value (NaN or Infinity with digits after it)"
                 : rapidjson::GetParseError_En(r.Code());
    if (!e.what.empty() && e.what.back() == '.') e.what.pop_back();  // it goes inside a sentence
    e.offset = r.Offset();
    // Most errors of a cut text are at its end; a cut escape is reported at its backslash.
    const auto code = r.Code();
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
