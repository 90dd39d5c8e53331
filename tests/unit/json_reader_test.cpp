// runtime/json/json_reader: RapidJSON with what the corpus and `longwave report` rely on: Python's NaN and
// Infinity, lone surrogates as U+FFFD, a later duplicate winning, error positions and truncation detected.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "runtime/json/json_reader.hpp"

using longwave::runtime::find_member;
using longwave::runtime::json_error;
using longwave::runtime::parse_json;

namespace {

json_error error_of(const std::string& text) {
  rapidjson::Document doc;
  const auto e = parse_json(text, doc);
  CATCH_REQUIRE(e.has_value());
  return *e;
}

std::string string_of(const std::string& text) {
  rapidjson::Document doc;
  CATCH_REQUIRE_FALSE(parse_json(text, doc).has_value());
  CATCH_REQUIRE(doc.IsString());
  return std::string(doc.GetString(), doc.GetStringLength());
}

}  // namespace

CATCH_TEST_CASE("json reader: Python's non-finite numbers, lone surrogates and duplicate keys",
                "[unit][json]") {
  rapidjson::Document doc;
  CATCH_REQUIRE_FALSE(
      parse_json(R"({"loss": NaN, "up": Infinity, "down": -Infinity, "k": 1, "k": 2, "x": 0.1})", doc));
  CATCH_CHECK(std::isnan(find_member(doc, "loss")->GetDouble()));
  CATCH_CHECK(find_member(doc, "up")->GetDouble() == HUGE_VAL);
  CATCH_CHECK(find_member(doc, "down")->GetDouble() == -HUGE_VAL);
  CATCH_CHECK(find_member(doc, "k")->GetInt() == 2);  // the later duplicate wins
  CATCH_CHECK(find_member(doc, "x")->GetDouble() == 0.1);
  CATCH_CHECK(find_member(doc, "missing") == nullptr);
  CATCH_CHECK(find_member(doc["x"], "x") == nullptr);  // not an object

  CATCH_CHECK(string_of(R"("\ud83d\ude00 \u00e9")") == "\xF0\x9F\x98\x80 \xC3\xA9");
  CATCH_CHECK(string_of(R"("a\udc00b")") ==
              "a\xEF\xBF\xBD"
              "b");
  // A high surrogate without its low half is U+FFFD, and the escape after it still counts.
  CATCH_CHECK(string_of(R"("\ud800\u0041")") ==
              "\xEF\xBF\xBD"
              "A");
  CATCH_CHECK(string_of(R"("\ud83d\ud83d\ude00")") == "\xEF\xBF\xBD\xF0\x9F\x98\x80");
  CATCH_CHECK(string_of(R"("\\ud800")") == "\\ud800");  // an escaped backslash, no escape
}

CATCH_TEST_CASE("json reader: an error names its line and column", "[unit][json]") {
  auto e = error_of("{\n  \"a\": 1,\n  \"b\" 2\n}");
  CATCH_CHECK(e.what == "Missing a colon after a name of object member");
  CATCH_CHECK(e.line == 3);
  CATCH_CHECK(e.column == 7);
  CATCH_CHECK_FALSE(e.truncated);
  CATCH_CHECK(error_of("{} x").what == "The document root must not be followed by other values");
  CATCH_CHECK(error_of("[nan]").column == 3);  // Python writes NaN; "n" starts null, so "a" is wrong
  CATCH_CHECK(error_of(std::string("{}\0x", 4)).column == 3);
  // Deep nesting is an error, not a stack overflow.
  CATCH_CHECK(error_of(std::string(100000, '[')).truncated);
}

CATCH_TEST_CASE("json reader: a text that ends inside a value is reported truncated", "[unit][json]") {
  for (const std::string cut : {"{", "{\"kind\"", "{\"kind\": \"st", "{\"a\": 1", "{\"a\": 1.", "{\"a\": -",
                                "{\"a\": tr", "{\"a\": [1, ", "{\"a\": \"\\u00", "\"\\ud83d\\", "[N"}) {
    CATCH_INFO(cut);
    CATCH_CHECK(error_of(cut).truncated);
  }
  for (const std::string bad : {"[T", "{\"a\": F", "{\"a\": tx}", "{\"a\": 1 2}", "{\"a\": \"\\q\"}"}) {
    CATCH_INFO(bad);
    CATCH_CHECK_FALSE(error_of(bad).truncated);
  }
}

// Found by fuzz/corpus_fuzz. RapidJSON 1.1.0's full precision passes 0 to __builtin_clzll here and reads
// garbage (0e100 as -2e235 in a GCC build); parse_json no longer uses it.
CATCH_TEST_CASE("json reader: zeros with many digits or an exponent read as 0", "[unit][json]") {
  rapidjson::Document doc;
  const std::string text =
      R"({"a": 0.0000000000000000000000000000000000000000, "b": [0e100, -0E-400, 0.0e+5, 0, -0, 0.0],)"
      R"( "c": "0e100 in a string stays", "d": 1e-320, "e": 0.1, "f": 100e-2, "g": -Infinity})";
  CATCH_REQUIRE_FALSE(parse_json(text, doc));
  CATCH_CHECK(doc["a"].IsDouble());
  CATCH_CHECK(doc["a"].GetDouble() == 0.0);
  const auto& b = doc["b"];
  CATCH_CHECK(b[0].GetDouble() == 0.0);
  CATCH_CHECK(b[1].GetDouble() == 0.0);
  CATCH_CHECK(std::signbit(b[1].GetDouble()));
  CATCH_CHECK(b[2].GetDouble() == 0.0);
  CATCH_CHECK(b[3].IsInt());  // plain integers keep their kind
  CATCH_CHECK(b[4].IsInt());
  CATCH_CHECK(b[5].IsDouble());
  CATCH_CHECK(std::string(doc["c"].GetString()) == "0e100 in a string stays");
  CATCH_CHECK(doc["d"].GetDouble() == 1e-320);  // exact: a subnormal, and 0.1 to the last bit
  CATCH_CHECK(doc["e"].GetDouble() == 0.1);
  CATCH_CHECK(doc["f"].GetDouble() == 1.0);
  CATCH_CHECK(std::isinf(doc["g"].GetDouble()));
  // An error after such a zero names its own column.
  const auto e = parse_json("[0e100, x]", doc);
  CATCH_REQUIRE(e);
  CATCH_CHECK(e->column == 9);
}

// Found by fuzz/metrics_jsonl_fuzz: RapidJSON 1.1.0's full precision indexed past its table of powers of ten
// for a number with hundreds of leading zeros (UBSan: a signed overflow in GetCachedPower10).
CATCH_TEST_CASE("json reader: exact numbers are correctly rounded, with hundreds of digits too",
                "[unit][json]") {
  const std::string zeros(470, '0');
  const std::string text = "[0." + zeros + "14890132093788110000000000000000000, 0." + std::string(299, '0') +
                           "1e299, 1" + std::string(299, '0') + "e-299, 4.9406564584124654e-324, 0.1e1, " +
                           "2.2250738585072011e-308, -9223372036854775808, 18446744073709551616, 9e308]";
  rapidjson::Document doc;
  CATCH_REQUIRE_FALSE(parse_json(text, doc));
  CATCH_CHECK(doc[0].GetDouble() == 0.0);  // below the smallest subnormal
  CATCH_CHECK(doc[1].GetDouble() == 0.1);
  CATCH_CHECK(doc[2].GetDouble() == 1.0);
  CATCH_CHECK(doc[3].GetDouble() == std::numeric_limits<double>::denorm_min());
  CATCH_CHECK(doc[4].GetDouble() == 1.0);
  CATCH_CHECK(doc[5].GetDouble() == 0x0.fffffffffffffp-1022);  // the largest subnormal, rounded from below
  CATCH_CHECK(doc[6].IsInt64());
  CATCH_CHECK(doc[6].GetInt64() == std::numeric_limits<int64_t>::min());
  CATCH_CHECK(doc[7].IsDouble());  // past 64 bits: a double, as RapidJSON reads it
  CATCH_CHECK(doc[7].GetDouble() == 18446744073709551616.0);
  CATCH_CHECK(std::isinf(doc[8].GetDouble()));
  // The grammar is RapidJSON's, but for what it lets follow NaN and Infinity (it read "NaN.5" as 0.5 with
  // its own conversion; found by fuzz/metrics_jsonl_fuzz).
  for (const std::string bad : {"[01]", "[1.]", "[1e]", "[-]", "[0e999]", "[1e309]", "[Infinit]", "[NaN.5]",
                                "[-Infinity0]", "[Inf.0e1]", "[NaNe5]"}) {
    CATCH_INFO(bad);
    CATCH_CHECK(parse_json(bad, doc));
  }
  CATCH_CHECK(parse_json("[NaN.5]", doc)->what == "Invalid value (NaN or Infinity with digits after it)");
  CATCH_CHECK(parse_json("[NaN.5]", doc)->column == 2);
  CATCH_REQUIRE_FALSE(parse_json("[NaN, -NaN, Inf, -Inf, Infinity, -Infinity]", doc));
  CATCH_CHECK(std::isnan(doc[1].GetDouble()));
  CATCH_CHECK(doc[5].GetDouble() == -std::numeric_limits<double>::infinity());
}
