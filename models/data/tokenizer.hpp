#pragma once
// The tokenizer interface shared by the byte and BPE tokenizers, and the factory that loads either from a
// file.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace longwave::models::data {

/// Maps bytes to uint16 token ids and back. For every byte string s, decode(encode(s)) == s.
class tokenizer {
 public:
  virtual ~tokenizer() = default;

  /// Number of token ids; every id encode() returns is below it. At most 65536.
  virtual int64_t vocab_size() const = 0;
  /// Token ids for `text` (any bytes, not only valid UTF-8).
  virtual std::vector<uint16_t> encode(std::string_view text) const = 0;
  /// The bytes of `tokens`. Throws lw_error(corrupt_data) on an id >= vocab_size().
  virtual std::string decode(const std::vector<uint16_t>& tokens) const = 0;
  /// "byte" or "bpe".
  virtual std::string kind() const = 0;
  /// Writes the tokenizer atomically in the text format load_tokenizer() reads. Throws lw_error(io_error).
  virtual void save(const std::string& path) const = 0;
  /// What save() writes: the same for any file that parses to this tokenizer (CRLF, trailing blank lines).
  virtual std::string text() const = 0;
};

/// The 256-token identity tokenizer on bytes.
std::unique_ptr<tokenizer> make_byte_tokenizer();

/// Loads a tokenizer saved by tokenizer::save(): the first line "longwave-byte 1" or "longwave-bpe 1" selects
/// the kind. Throws lw_error(io_error) if unreadable, lw_error(corrupt_data) naming file:line if malformed.
std::unique_ptr<tokenizer> load_tokenizer(const std::string& path);
/// The same from the file's text; `where` names it in errors.
std::unique_ptr<tokenizer> parse_tokenizer(const std::string& text, const std::string& where);

/// A tokenizer as a checkpoint names it: "bpe vocab=500 crc32c=5e564986" (kind, vocabulary, the CRC-32C
/// of what save() writes, so a file with CRLF line ends names the same), "byte vocab=256" (all are one).
std::string tokenizer_label(const tokenizer& tok);

}  // namespace longwave::models::data
