// Corpus reading: plain files as raw bytes, .jsonl files as the string field "text" of one JSON object per
// line.
#include "models/data/corpus.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "models/data/file_io.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/json/json_reader.hpp"

namespace longwave::models::data {

namespace {

bool ends_with_jsonl(const std::string& path) {
  constexpr std::string_view ext = ".jsonl";
  if (path.size() < ext.size()) return false;
  return std::equal(ext.begin(), ext.end(), path.end() - static_cast<std::ptrdiff_t>(ext.size()),
                    [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
}

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

}  // namespace

std::string cache_root() {
  std::filesystem::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    base = std::filesystem::path(home) / ".cache";
  else
    base = "/tmp";
  return (base / "longwave").string();
}

std::string default_corpus_path() {
  if (const char* env = std::getenv("LONGWAVE_CORPUS"); env && *env) return env;
  return (std::filesystem::path(cache_root()) / "kjv.txt").string();
}

text_profile profile_text(std::string_view text) {
  text_profile p;
  p.bytes = static_cast<int64_t>(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      if ((c < 0x20 && (c < '\t' || c > '\r')) || c == 0x7f) ++p.control;
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (no overlong forms, surrogates or code points past
    // U+10FFFF), as in the Unicode standard's table of well-formed UTF-8.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = len > 0 && i + len <= n && s[i + 1] >= lo && s[i + 1] <= hi;
    for (size_t k = 2; ok && k < len; ++k) ok = s[i + k] >= 0x80 && s[i + k] <= 0xBF;
    if (ok) {
      i += len;
    } else {
      ++p.invalid_utf8;
      ++i;
    }
  }
  return p;
}

void check_is_text(const std::string& path, const text_profile& profile) {
  if (profile.bytes == 0) return;
  const double share = static_cast<double>(profile.control) / static_cast<double>(profile.bytes);
  if (share <= max_control_share) return;
  throw lw_error(
      errc::corrupt_data,
      fmt::format("corpus '{}' is not text: {:.1f} % of its {} bytes are NUL or control characters "
                  "(text has almost none; at most {:.0f} % are allowed); pass a text or JSONL file, "
                  "or a directory with llm.c train.bin and val.bin",
                  path, 100 * share, profile.bytes, 100 * max_control_share));
}

std::optional<std::string> json_string_field(std::string_view line, std::string_view key) {
  rapidjson::Document doc;
  if (const auto e = runtime::parse_json(line, doc))
    throw std::invalid_argument(fmt::format("malformed JSON at column {}: {}", e->column, e->what));
  if (!doc.IsObject()) throw std::invalid_argument("the line is not a JSON object");
  const auto* field = runtime::find_member(doc, key);
  if (!field) return std::nullopt;
  if (!field->IsString()) throw std::invalid_argument(fmt::format("field \"{}\" is not a string", key));
  return std::string(field->GetString(), field->GetStringLength());
}

std::string read_corpus(const std::string& path, const std::string& refuse_binary_as) {
  // Binary data is refused as soon as its control bytes alone pass max_control_share of the whole file,
  // not after gigabytes of it are read (check_is_text counts the whole text after).
  int64_t control = 0, seen = 0;
  const auto early_binary_check = [&](std::string_view chunk, uint64_t size) {
    if (refuse_binary_as.empty()) return;
    control += profile_text(chunk).control;
    seen += static_cast<int64_t>(chunk.size());
    if (size == 0 || static_cast<double>(control) <= max_control_share * static_cast<double>(size)) return;
    throw lw_error(
        errc::corrupt_data,
        fmt::format("corpus '{}' is not text: its first {} bytes already hold {} NUL or control "
                    "characters, more than {:.0f} % of its {} bytes (text has almost none); pass a "
                    "text or JSONL file, or a directory with llm.c train.bin and val.bin",
                    refuse_binary_as, seen, control, 100 * max_control_share, size));
  };
  std::string bytes = read_file(path, "corpus", early_binary_check);
  if (!ends_with_jsonl(path)) {
    if (bytes.empty())
      throw lw_error(
          errc::corrupt_data,
          fmt::format("corpus '{}' is empty{}", path,
                      path.rfind("/proc/", 0) == 0 || path.rfind("/sys/", 0) == 0
                          ? " (a file of /proc or /sys: its size reads 0, and only that much is read)"
                          : ""));
    return bytes;
  }
  std::string text;
  std::string_view rest(bytes);
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);  // UTF-8 byte-order mark
  int64_t line_no = 0;
  int64_t n_docs = 0;
  while (!rest.empty()) {
    ++line_no;
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (is_blank(line)) continue;
    std::optional<std::string> doc;
    try {
      doc = json_string_field(line, "text");
    } catch (const std::invalid_argument& e) {
      throw lw_error(errc::corrupt_data, fmt::format("corpus {}:{}: {}", path, line_no, e.what()));
    }
    if (!doc) {
      throw lw_error(errc::corrupt_data,
                     fmt::format("corpus {}:{}: object has no string field \"text\"", path, line_no));
    }
    if (doc->empty()) continue;
    if (n_docs++ > 0) text += "\n\n";
    text += *doc;
  }
  if (text.empty()) {
    throw lw_error(errc::corrupt_data,
                   fmt::format("corpus '{}' is empty: no non-empty \"text\" documents", path));
  }
  return text;
}

}  // namespace longwave::models::data
