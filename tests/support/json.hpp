#pragma once
// Test helper: strict JSON (RFC 8259) for dashboard files and Prometheus API answers, read with the runtime's
// reader (runtime/json_reader.hpp); a parse failure throws.
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/json_reader.hpp"

namespace longwave::test {

using json = runtime::json;

/// Parses a whole JSON document; throws std::runtime_error naming the line and column of the first problem.
inline json parse_json(const std::string& text) {
  runtime::json_error e;
  auto v = runtime::parse_json(text, {}, &e);
  if (!v)
    throw std::runtime_error("json: " + e.what + " at line " + std::to_string(e.line) + ", column " +
                             std::to_string(e.column));
  return std::move(*v);
}

}  // namespace longwave::test
