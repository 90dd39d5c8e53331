// Which train tokens each worker reads (data.partition), and the document starts behind `books`.
#include "models/data/partition.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <charconv>

#include "models/data/file_io.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

namespace {

constexpr const char* docs_header = "longwave-docs 1";

// part*n/parts without overflow.
int64_t share(int64_t part, int64_t n, int64_t parts) {
  return static_cast<int64_t>(static_cast<__int128>(part) * n / parts);
}

// The document start nearest to `at` (the earlier one on a tie); 0 when there is none.
int64_t nearest_start(const std::vector<int64_t>& starts, int64_t at) {
  auto it = std::lower_bound(starts.begin(), starts.end(), at);
  if (it == starts.end()) return starts.empty() ? 0 : starts.back();
  if (it == starts.begin() || *it == at) return *it;
  const int64_t before = *std::prev(it);
  return at - before <= *it - at ? before : *it;
}

std::vector<token_span> iid_spans(int64_t n, int64_t part, int64_t parts, int64_t row_len) {
  int64_t block = iid_block_windows * row_len;
  if (n / block < 4 * parts) block = std::max(row_len, n / (4 * parts));  // at least 4 blocks a part
  std::vector<token_span> spans;
  for (int64_t b = part; b * block < n; b += parts)
    spans.push_back({b * block, std::min(n, (b + 1) * block)});
  return spans;
}

std::vector<token_span> book_spans(int64_t n, const std::vector<int64_t>& doc_starts, int64_t part,
                                   int64_t parts, int64_t row_len) {
  std::vector<int64_t> starts;
  for (int64_t s : doc_starts)
    if (s > 0 && s < n) starts.push_back(s);
  const auto boundary = [&](int64_t m) {
    return m == 0 ? 0 : m == parts ? n : nearest_start(starts, share(m, n, parts));
  };
  const token_span span{boundary(part), boundary(part + 1)};
  if (span.end - span.begin < row_len + 1) {
    // The documents that begin in the span, the first one's included (an empty span holds none).
    const auto docs =
        span.end <= span.begin ? 0 : std::count_if(starts.begin(), starts.end(), [&](int64_t s) {
                                       return s >= span.begin && s < span.end;
                                     }) + (span.begin == 0 ? 1 : 0);
    throw lw_error(errc::invalid_config,
                   fmt::format("data.partition = books: part {} of {} gets {} tokens ({} whole document{}), "
                               "too few for one window of {} tokens; the train tokens hold {} documents for "
                               "{} parts: use fewer workers, or data.partition = contiguous or iid",
                               part + 1, parts, span.end - span.begin, docs, docs == 1 ? "" : "s", row_len,
                               starts.size() + 1, parts));
  }
  return {span};
}

}  // namespace

std::vector<token_span> partition_spans(config::data_partition kind, int64_t n_tokens,
                                        const std::vector<int64_t>& doc_starts, int64_t part, int64_t parts,
                                        int64_t row_len) {
  if (parts <= 0 || part < 0 || part >= parts || row_len <= 0 || n_tokens < 0) {
    throw lw_error(errc::invalid_config, fmt::format("data part {} of {} (windows of {} tokens, {} tokens) "
                                                     "is not a valid partition",
                                                     part, parts, row_len, n_tokens));
  }
  switch (kind) {
    case config::data_partition::contiguous:
      return {{share(part, n_tokens, parts), share(part + 1, n_tokens, parts)}};
    case config::data_partition::iid: return iid_spans(n_tokens, part, parts, row_len);
    case config::data_partition::books:
      if (doc_starts.empty()) {
        throw lw_error(
            errc::invalid_config,
            "data.partition = books needs the documents' starts, which longwave records when it "
            "prepares a corpus (train.docs beside train.bin); these shards have none: prepare them with "
            "longwave data prepare, or use data.partition = contiguous or iid");
      }
      return book_spans(n_tokens, doc_starts, part, parts, row_len);
  }
  throw lw_error(errc::invalid_config, fmt::format("data.partition {} is unknown", static_cast<int>(kind)));
}

std::vector<int64_t> blank_line_starts(const std::string& text) {
  std::vector<int64_t> starts{0};
  for (size_t search = 0;;) {
    size_t p = std::min(text.find("\n\n", search), text.find("\n\r\n", search));  // CRLF text too
    if (p == std::string::npos) break;
    while (p < text.size() && (text[p] == '\n' || text[p] == '\r')) ++p;  // after the whole run
    if (p < text.size()) starts.push_back(static_cast<int64_t>(p));
    search = p;
  }
  return starts;
}

std::vector<int64_t> token_starts(const std::vector<int64_t>& byte_starts,
                                  const std::vector<uint16_t>& tokens,
                                  const std::vector<int64_t>& token_bytes) {
  std::vector<int64_t> starts{0};
  size_t next = 0;   // the first byte start not yet placed
  int64_t byte = 0;  // where token t begins in the text
  for (size_t t = 0; t < tokens.size() && next < byte_starts.size(); ++t) {
    while (next < byte_starts.size() && byte >= byte_starts[next]) {
      if (starts.back() != static_cast<int64_t>(t)) starts.push_back(static_cast<int64_t>(t));
      ++next;
    }
    byte += token_bytes[tokens[t]];
  }
  return starts;
}

std::vector<int64_t> document_starts(const std::string& text, const std::vector<uint16_t>& tokens,
                                     const std::vector<int64_t>& token_bytes) {
  return token_starts(blank_line_starts(text), tokens, token_bytes);
}

void write_document_starts(const std::string& path, const std::vector<int64_t>& starts, int64_t n_tokens) {
  std::string out = std::string(docs_header) + "\n";
  for (int64_t s : starts)
    if (s < n_tokens) out += fmt::format("{}\n", s);
  write_file_atomic(path, {out});
}

namespace {

// A header line, then one increasing offset per line, the first 0.
std::vector<int64_t> read_offsets(const std::string& path, std::string_view header, const char* unit) {
  const std::string text = read_file(path, "document starts");
  std::vector<int64_t> starts;
  size_t pos = 0;
  for (int line = 1; pos < text.size(); ++line) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view l(text.data() + pos, end - pos);
    pos = end + 1;
    if (line == 1) {
      if (l != header) {
        throw lw_error(errc::corrupt_data, fmt::format("{}:1: expected '{}', found '{}'", path,
                                                       std::string(header), std::string(l)));
      }
      continue;
    }
    int64_t v = -1;
    const auto [p, ec] = std::from_chars(l.data(), l.data() + l.size(), v);
    if (ec != std::errc() || p != l.data() + l.size() || v < 0 || (!starts.empty() && v <= starts.back())) {
      throw lw_error(errc::corrupt_data, fmt::format("{}:{}: '{}' is not a {} offset above the previous one",
                                                     path, line, std::string(l), unit));
    }
    starts.push_back(v);
  }
  if (starts.empty() || starts.front() != 0)
    throw lw_error(errc::corrupt_data, fmt::format("{}: no document starts at {} 0", path, unit));
  return starts;
}

}  // namespace

std::vector<int64_t> read_document_starts(const std::string& path) {
  return read_offsets(path, docs_header, "token");
}

std::vector<int64_t> read_document_bytes(const std::string& path) {
  return read_offsets(path, "longwave-doc-bytes 1", "byte");
}

}  // namespace longwave::models::data
