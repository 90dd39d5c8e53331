// runtime/json_reader: strict JSON for the tests' files and answers, and the lenient form of metrics.jsonl
// lines that `longwave report` reads (nan/inf numbers, later duplicates win, truncation detected).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "runtime/json_reader.hpp"

using longwave::runtime::json;
using longwave::runtime::json_error;
using longwave::runtime::json_options;
using longwave::runtime::parse_json;

namespace {

const json_options lenient{/*nonfinite_numbers=*/true, /*strict=*/false, /*max_depth=*/16};

json_error error_of(const std::string& text, const json_options& o = {}) {
  json_error e;
  CATCH_REQUIRE_FALSE(parse_json(text, o, &e).has_value());
  return e;
}

}  // namespace

CATCH_TEST_CASE("json reader: a nested document with every kind of value", "[unit][json]") {
  const auto v = parse_json(
      R"( {"a": [1, -2.5e3, 0.125, true, false, null], "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {"k": {}}} )");
  CATCH_REQUIRE(v.has_value());
  CATCH_REQUIRE(v->is_object());
  const auto& a = v->at("a");
  CATCH_REQUIRE(a.is_array());
  CATCH_REQUIRE(a.arr.size() == 6);
  CATCH_CHECK(a.arr[0].num == 1);
  CATCH_CHECK(a.arr[1].num == -2500);
  CATCH_CHECK(a.arr[2].num == 0.125);
  CATCH_CHECK((a.arr[3].is_bool() && a.arr[3].b));
  CATCH_CHECK((a.arr[4].is_bool() && !a.arr[4].b));
  CATCH_CHECK(a.arr[5].is_null());
  CATCH_CHECK(v->at("s").str == "x\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  CATCH_CHECK(v->at("o").at("k").is_object());
  CATCH_CHECK(v->find("missing") == nullptr);
  CATCH_CHECK_THROWS_WITH(v->at("missing"), "json: no member \"missing\"");
  CATCH_CHECK_THROWS_WITH(a.at("x"), "json: not an object, looking for \"x\"");
}

CATCH_TEST_CASE("json reader: strict mode names the problem, its line and column", "[unit][json]") {
  auto e = error_of("{\n  \"a\": 1,\n  \"a\": 2\n}");
  CATCH_CHECK(e.what == "duplicate member \"a\"");
  CATCH_CHECK(e.line == 3);
  CATCH_CHECK(e.column == 3);
  CATCH_CHECK_FALSE(e.truncated);
  CATCH_CHECK(error_of("{\"a\": \"x\ty\"}").what == "control character in a string");
  CATCH_CHECK(error_of("\"\\ud800\"").what == "lone surrogate");
  CATCH_CHECK(error_of("[01]").what == "expected ',' or ']'");
  CATCH_CHECK(error_of("[1.]").what == "bad number: no digits after '.'");
  CATCH_CHECK(error_of("[1e+]").what == "bad number: no exponent digits");
  CATCH_CHECK(error_of("[nan]").what == "unexpected character 'n'");  // not JSON without the option
  CATCH_CHECK(error_of("{} x").what == "unexpected text after the value");
  CATCH_CHECK(error_of("\"\\q\"").what == "bad escape \\q");
  CATCH_CHECK(error_of(std::string(300, '[') + std::string(300, ']')).what == "nesting too deep");
}

CATCH_TEST_CASE("json reader: a text that ends inside a value is reported truncated", "[unit][json]") {
  for (const std::string cut : {"{", "{\"kind\"", "{\"kind\": \"st", "{\"a\": 1", "{\"a\": 1.", "{\"a\": -",
                                "{\"a\": tr", "{\"a\": [1, ", "{\"a\": \"\\u00"}) {
    CATCH_INFO(cut);
    CATCH_CHECK(error_of(cut, lenient).truncated);
    CATCH_CHECK(error_of(cut).truncated);
  }
  CATCH_CHECK(error_of("\"\\ud83d\\").truncated);  // cut inside a surrogate pair
  CATCH_CHECK(error_of("[N", lenient).truncated);  // NaN, cut
  CATCH_CHECK_FALSE(error_of("[N").truncated);     // no JSON value starts with N
  CATCH_CHECK_FALSE(error_of("[T", lenient).truncated);
  CATCH_CHECK_FALSE(error_of("{\"a\": F", lenient).truncated);
  CATCH_CHECK_FALSE(error_of("{\"a\": tx}", lenient).truncated);
  CATCH_CHECK_FALSE(error_of("{\"a\": 1 2}", lenient).truncated);
}

CATCH_TEST_CASE("json reader: the lenient form of metrics lines", "[unit][json]") {
  const auto v = parse_json(
      R"({"loss": nan, "up": inf, "down": -Infinity, "k": 1, "k": 2, "t": "a	b", "u": "\udc00"})",
      lenient);
  CATCH_REQUIRE(v.has_value());
  CATCH_CHECK(std::isnan(v->at("loss").num));
  CATCH_CHECK(v->at("up").num == HUGE_VAL);
  CATCH_CHECK(v->at("down").num == -HUGE_VAL);
  CATCH_CHECK(v->at("k").num == 2);               // the later duplicate wins
  CATCH_CHECK(v->at("t").str == "a\tb");          // a raw tab kept
  CATCH_CHECK(v->at("u").str == "\xEF\xBF\xBD");  // a lone surrogate reads as U+FFFD
  // A high surrogate without its low half is U+FFFD, and the escape after it still counts.
  CATCH_CHECK(parse_json(R"("\ud800\u0041")", lenient)->str ==
              "\xEF\xBF\xBD"
              "A");
  CATCH_CHECK(parse_json(R"("\ud83d\ud83d\ude00")", lenient)->str == "\xEF\xBF\xBD\xF0\x9F\x98\x80");
  CATCH_CHECK(error_of(R"("\ud800\u0041")").what == "bad low surrogate");
  CATCH_CHECK(error_of("{\"a\": nanx}", lenient).what == "unexpected character 'n'");
  // max_depth 16: sixteen levels below the outermost value.
  CATCH_CHECK(parse_json(std::string(17, '[') + std::string(17, ']'), lenient).has_value());
  CATCH_CHECK(error_of(std::string(18, '[') + std::string(18, ']'), lenient).what == "nesting too deep");
}
