#pragma once
// Reads one JSON text with RapidJSON as Python's json module writes it (NaN and Infinity as numbers): corpus
// .jsonl lines and metrics.jsonl records. A failure says where, and whether the text ended inside the value.
#include <rapidjson/document.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace longwave::runtime {

/// Where and why a text failed to parse.
struct json_error {
  std::string what;   ///< RapidJSON's words, e.g. "Missing a closing quotation mark in string" (no period)
  size_t offset = 0;  ///< byte offset of the problem
  size_t line = 1;    ///< 1-based
  size_t column = 1;  ///< 1-based, in bytes
  bool truncated = false;  ///< the text ended before the value did (a writer stopped mid-record)
};

/// Parses one whole JSON document into `doc`: RFC 8259 plus NaN, Inf, Infinity, -Inf and -Infinity, which
/// Python writes for non-finite floats. Numbers are read exactly (each one's text through strtod, which
/// rounds correctly; an integer that fits 64 bits stays an integer). A lone UTF-16 surrogate escape (Python
/// writes one for an undecodable byte) reads as U+FFFD. Nesting depth costs no stack. Returns the error, or
/// nullopt when `doc` holds the value.
std::optional<json_error> parse_json(std::string_view text, rapidjson::Document& doc);

/// The last member named `key` of an object (a later duplicate wins, as in Python), or nullptr when `v` is
/// not an object or has no such member.
const rapidjson::Value* find_member(const rapidjson::Value& v, std::string_view key);

}  // namespace longwave::runtime
