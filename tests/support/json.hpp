#pragma once
// Test helper: strict JSON (RFC 8259, no duplicate member names) for dashboard files and Prometheus API
// answers, read with RapidJSON; a parse failure or a missing member throws.
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

namespace longwave::test {

using json = rapidjson::Value;

namespace detail {

inline void check_unique_members(const json& v) {
  if (v.IsArray())
    for (const auto& e : v.GetArray()) check_unique_members(e);
  if (!v.IsObject()) return;
  std::set<std::string_view> names;
  for (const auto& m : v.GetObject()) {
    if (!names.insert({m.name.GetString(), m.name.GetStringLength()}).second)
      throw std::runtime_error("json: duplicate member \"" + std::string(m.name.GetString()) + "\"");
    check_unique_members(m.value);
  }
}

}  // namespace detail

/// Parses a whole JSON document; throws std::runtime_error naming the line and column of the first problem.
inline rapidjson::Document parse_json(const std::string& text) {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseIterativeFlag>(text.data(), text.size());
  if (doc.HasParseError()) {
    size_t line = 1, column = 1;
    for (size_t k = 0; k < doc.GetErrorOffset() && k < text.size(); ++k)
      text[k] == '\n' ? (++line, column = 1) : ++column;
    std::string what = rapidjson::GetParseError_En(doc.GetParseError());
    if (!what.empty() && what.back() == '.') what.pop_back();
    throw std::runtime_error("json: " + what + " at line " + std::to_string(line) + ", column " +
                             std::to_string(column));
  }
  detail::check_unique_members(doc);
  return doc;
}

/// Whether `v` is an object with member `key`.
inline bool has(const json& v, const char* key) {
  return v.IsObject() && v.HasMember(key);
}

/// The member `key` of an object; throws naming the key if `v` is not an object or has no such member.
inline const json& at(const json& v, const char* key) {
  if (!v.IsObject())
    throw std::runtime_error(std::string("json: not an object, looking for \"") + key + "\"");
  const auto it = v.FindMember(key);
  if (it == v.MemberEnd()) throw std::runtime_error(std::string("json: no member \"") + key + "\"");
  return it->value;
}

/// A string's text; throws if `v` is not a string.
inline std::string str(const json& v) {
  if (!v.IsString()) throw std::runtime_error("json: not a string");
  return std::string(v.GetString(), v.GetStringLength());
}

}  // namespace longwave::test
