// runtime/json/json_reader: RapidJSON with what the corpus and `longwave report` rely on: Python's NaN and
// Infinity, lone surrogates as U+FFFD, a later duplicate winning, error positions and truncation detected.
#include <catch2/catch.hpp>

#include <cmath>
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

// Found by fuzz/corpus_fuzz. RapidJSON 1.1.0's full precision (json_numbers::exact) passes 0 to
// __builtin_clzll here and reads garbage (0e100 as -2e235 in a GCC build); the corpus reader does not use it.
CATCH_TEST_CASE("json reader: zeros with many digits or an exponent read as 0 with approximate numbers",
                "[unit][json]") {
  rapidjson::Document doc;
  CATCH_REQUIRE_FALSE(parse_json("[0.0000000000000000000000000000000000000000, 0e100, -0e-400, 1.5]", doc,
                                 longwave::runtime::json_numbers::approximate));
  CATCH_CHECK(doc[0].GetDouble() == 0.0);
  CATCH_CHECK(doc[1].GetDouble() == 0.0);
  CATCH_CHECK(doc[2].GetDouble() == 0.0);
  CATCH_CHECK(doc[3].GetDouble() == 1.5);
}
