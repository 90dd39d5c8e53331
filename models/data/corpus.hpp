#pragma once
// Corpus reading: plain files as raw bytes, .jsonl files as the string field "text" of one JSON object per
// line.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace longwave::models::data {

/// Longwave's cache directory: ${XDG_CACHE_HOME:-~/.cache}/longwave (/tmp/longwave without a home).
std::string cache_root();

/// The bundled default corpus: $LONGWAVE_CORPUS, else ${XDG_CACHE_HOME:-~/.cache}/longwave/kjv.txt
/// (written by scripts/setup).
std::string default_corpus_path();

/// Reads a training corpus. A path ending in ".jsonl" is read as one JSON object per line whose string field
/// "text" is one document (escapes and \uXXXX surrogate pairs decoded to UTF-8); blank lines are skipped and
/// documents are joined with "\n\n". Any other file is read as raw bytes.
/// Throws lw_error(io_error) if the file cannot be read, lw_error(corrupt_data) naming file:line for a
/// malformed line or a line without a string "text", and lw_error(corrupt_data) if the corpus is empty.
/// refuse_binary_as: when set, a file whose control bytes are over max_control_share of its size is refused
/// (corrupt_data, naming it so) as soon as the part read shows it, instead of being read to its end.
std::string read_corpus(const std::string& path, const std::string& refuse_binary_as = "");

/// How much of a corpus reads as text.
struct text_profile {
  int64_t bytes = 0;
  /// NUL and the other C0 control bytes except \t \n \v \f \r, and DEL: what binary data is full of (about
  /// 11 % of random bytes, half of UTF-16 text) and text has none of.
  int64_t control = 0;
  int64_t invalid_utf8 = 0;  ///< bytes that are not part of a well-formed UTF-8 sequence
};

/// Counts the control bytes and the bytes outside well-formed UTF-8 in `text`.
text_profile profile_text(std::string_view text);

/// Above this share of control bytes, a corpus is binary data, not text.
constexpr double max_control_share = 0.05;

/// Throws lw_error(corrupt_data) naming `path` and the share of control bytes when `profile` has more than
/// max_control_share of them: a binary file (an archive, an image, a model, UTF-16 text) would otherwise be
/// trained on as if it were text. Bytes that are not UTF-8 are no reason to refuse (Latin-1 or CP1251 text
/// trains as well at the byte level); the caller may warn about them.
void check_is_text(const std::string& path, const text_profile& profile);

/// Parses `line` as one JSON object and returns its top-level string field `key`, or nullopt if it has none.
/// Throws std::invalid_argument describing the problem if the line is not a single well-formed JSON object or
/// the field is not a string. Lenient where Python's json module is: NaN/Infinity numbers, a later duplicate
/// key wins, and lone UTF-16 surrogates decode to U+FFFD.
std::optional<std::string> json_string_field(std::string_view line, std::string_view key);

}  // namespace longwave::models::data
