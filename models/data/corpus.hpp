#pragma once
// Corpus reading: plain files as raw bytes, .jsonl files as the string field "text" of one JSON object per
// line.
#include <optional>
#include <string>
#include <string_view>

namespace longwave::models::data {

/// Reads a training corpus. A path ending in ".jsonl" is read as one JSON object per line whose string field
/// "text" is one document (escapes and \uXXXX surrogate pairs decoded to UTF-8); blank lines are skipped and
/// documents are joined with "\n\n". Any other file is read as raw bytes.
/// Throws lw_error(io_error) if the file cannot be read, lw_error(corrupt_data) naming file:line for a
/// malformed line or a line without a string "text", and lw_error(corrupt_data) if the corpus is empty.
std::string read_corpus(const std::string& path);

/// Parses `line` as one JSON object and returns its top-level string field `key`, or nullopt if it has none.
/// Throws std::invalid_argument describing the problem if the line is not a single well-formed JSON object or
/// the field is not a string. Lenient where Python's json module is: NaN/Infinity numbers, a later duplicate
/// key wins, and lone UTF-16 surrogates decode to U+FFFD.
std::optional<std::string> json_string_field(std::string_view line, std::string_view key);

}  // namespace longwave::models::data
