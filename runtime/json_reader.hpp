#pragma once
// A small JSON reader (RFC 8259) with one lenient mode, for metrics.jsonl lines (`longwave report`) and the
// tests' dashboard files and Prometheus answers. No JSON library is among the project's Debian packages.
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longwave::runtime {

/// One JSON value. Objects keep their members sorted by name.
struct json {
  enum class kind { null, boolean, number, string, array, object };

  kind type = kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<json> arr;
  std::map<std::string, json, std::less<>> obj;

  bool is_null() const { return type == kind::null; }
  bool is_bool() const { return type == kind::boolean; }
  bool is_number() const { return type == kind::number; }
  bool is_string() const { return type == kind::string; }
  bool is_array() const { return type == kind::array; }
  bool is_object() const { return type == kind::object; }

  /// The member `key` of an object, or null when this is not an object or has no such member.
  const json* find(std::string_view key) const;
  /// Whether this is an object with member `key`.
  bool has(std::string_view key) const { return find(key) != nullptr; }
  /// The member `key` of an object; throws std::runtime_error naming the key if there is none.
  const json& at(std::string_view key) const;
};

struct json_options {
  /// Also accept nan, inf, -inf and infinity as numbers (any case), which a C++ writer emits for a diverged
  /// loss. Strict JSON has no such numbers.
  bool nonfinite_numbers = false;
  /// Duplicate member names, control characters inside strings and unpaired surrogate escapes are errors.
  /// When false the last duplicate wins, control characters are kept and a lone surrogate reads as U+FFFD.
  bool strict = true;
  int max_depth = 256;
};

/// Where and why a document failed to parse.
struct json_error {
  std::string what;        ///< e.g. "expected ',' or '}'"
  size_t offset = 0;       ///< byte offset of the problem
  size_t line = 1;         ///< 1-based
  size_t column = 1;       ///< 1-based, in bytes
  bool truncated = false;  ///< the text ended before the value did (a writer stopped mid-record)
};

/// Parses one whole JSON document (surrounding white space allowed). nullopt on failure, with *error filled
/// when given.
std::optional<json> parse_json(std::string_view text, const json_options& options = {},
                               json_error* error = nullptr);

}  // namespace longwave::runtime
