#pragma once
// Which train tokens each worker reads (data.partition): the token spans of one part of the train shard, and
// the document starts a corpus's preparation records for the `books` partition.
#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::models::data {

/// Tokens [begin, end) of the train shard.
struct token_span {
  int64_t begin = 0;
  int64_t end = 0;
  friend bool operator==(const token_span& a, const token_span& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

/// Tokens per iid block: 8 windows of row_len tokens.
constexpr int64_t iid_block_windows = 8;

/// The spans part `part` of `parts` reads from n_tokens train tokens, for windows of row_len tokens:
/// - contiguous: [part*n/parts, (part+1)*n/parts);
/// - iid: blocks of iid_block_windows*row_len tokens (shorter when each part would get fewer than 4), block b
///   to part b mod parts, so every part's windows come from the whole corpus;
/// - books: the contiguous split with each boundary moved to the nearest document start in `doc_starts`
///   (sorted token offsets), so every part reads whole documents.
/// The parts never overlap and together cover the tokens. Throws lw_error(invalid_config) naming
/// data.partition and the sizes when the part has no room for one window (books: "N documents for P parts"),
/// or when books is asked for without document starts.
std::vector<token_span> partition_spans(config::data_partition kind, int64_t n_tokens,
                                        const std::vector<int64_t>& doc_starts, int64_t part, int64_t parts,
                                        int64_t row_len);

/// Byte offsets at which documents start in `text`: 0 and the first byte after each blank line (two or more
/// newlines, with or without CR; a JSONL corpus's documents are joined by one).
std::vector<int64_t> blank_line_starts(const std::string& text);

/// Token offsets of increasing byte offsets: 0 and, for each, the first token that begins at or after it.
/// `token_bytes[id]` is the byte length of token id.
std::vector<int64_t> token_starts(const std::vector<int64_t>& byte_starts,
                                  const std::vector<uint16_t>& tokens,
                                  const std::vector<int64_t>& token_bytes);

/// token_starts(blank_line_starts(text), ...): where `tokens`' documents start.
std::vector<int64_t> document_starts(const std::string& text, const std::vector<uint16_t>& tokens,
                                     const std::vector<int64_t>& token_bytes);

/// Reads CORPUS.docs, the byte offsets where a corpus's documents start when they are not marked by blank
/// lines (scripts/setup writes one for the KJV: its books): "longwave-doc-bytes 1", then one offset per line,
/// the first 0. Throws lw_error(io_error) / lw_error(corrupt_data) naming file:line.
std::vector<int64_t> read_document_bytes(const std::string& path);

/// Writes document starts below n_tokens to `path` atomically: "longwave-docs 1", then one offset per line.
/// Throws lw_error(io_error).
void write_document_starts(const std::string& path, const std::vector<int64_t>& starts, int64_t n_tokens);

/// Reads write_document_starts()'s file. Throws lw_error(io_error) if unreadable, lw_error(corrupt_data)
/// naming file:line when malformed or not increasing.
std::vector<int64_t> read_document_starts(const std::string& path);

}  // namespace longwave::models::data
