#pragma once
// Byte-level BPE (GPT-2 style, without a regex dependency): pre-splitting, training with incremental pair
// counts, encoding by merge rank, exact decoding, and the "longwave-bpe 1" text file format.
#include <functional>
#include <unordered_map>
#include <utility>

#include "models/data/tokenizer.hpp"

namespace longwave::models::data {

/// Byte-level BPE. Ids 0..255 are bytes; id 256 + r is the r-th merge. Any byte string round-trips exactly.
class bpe_tokenizer final : public tokenizer {
 public:
  using merge = std::pair<uint16_t, uint16_t>;
  using progress_fn = std::function<void(int64_t done, int64_t total)>;

  /// First line of the saved file. The file continues with the vocab size on line 2 and then one merge
  /// "left right" per line, in rank order.
  static constexpr const char* header = "longwave-bpe 1";
  /// Chunks longer than this are cut, which bounds the cost of encoding pathological input.
  static constexpr size_t max_chunk_bytes = 256;

  /// Learns vocab_size - 256 merges from `text` (fewer if the text runs out of pairs; vocab_size() tells).
  /// Each step merges the most frequent adjacent pair, ties going to the smallest (left, right) ids.
  /// `progress` is called after every merge with (merges done, merges wanted).
  /// Throws lw_error(invalid_config) unless 256 <= vocab_size <= 65536.
  static bpe_tokenizer train(std::string_view text, int64_t vocab_size, progress_fn progress = {});

  /// Loads a file written by save(). Throws lw_error(io_error) or lw_error(corrupt_data) naming file:line.
  static bpe_tokenizer load(const std::string& path);
  /// Parses the contents of a saved file; `path` is only used in error messages.
  static bpe_tokenizer parse(std::string_view text, const std::string& path);

  /// Splits text into the chunks merges never cross: whitespace runs, and an optional single leading space
  /// followed by a run of letters (ASCII letters and all bytes >= 128), a run of digits, or a run of other
  /// non-space bytes. Like GPT-2, a whitespace run followed by a word gives its last space to the word.
  /// The chunks concatenate to `text`.
  static std::vector<std::string_view> pre_split(std::string_view text);

  /// A tokenizer applying `merges` in rank order. Throws lw_error(corrupt_data) if a merge names an id
  /// not yet defined or there are more than 65280 merges.
  explicit bpe_tokenizer(std::vector<merge> merges);

  /// The merges in rank order.
  const std::vector<merge>& merges() const { return merges_; }

  int64_t vocab_size() const override { return 256 + static_cast<int64_t>(merges_.size()); }
  std::vector<uint16_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<uint16_t>& tokens) const override;
  std::string kind() const override { return "bpe"; }
  void save(const std::string& path) const override;
  std::string text() const override;

 private:
  void encode_chunk(std::string_view chunk, std::vector<uint16_t>& out) const;

  std::vector<merge> merges_;
  std::unordered_map<uint32_t, int32_t> ranks_;  // (left << 16 | right) -> merge rank
  std::vector<std::string> pieces_;              // bytes of each token id
};

}  // namespace longwave::models::data
