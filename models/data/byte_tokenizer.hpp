#pragma once
// The byte tokenizer: 256 tokens, token id = byte value. Saved as the single line "longwave-byte 1".
#include "models/data/tokenizer.hpp"

namespace longwave::models::data {

/// Identity tokenizer on bytes (vocab 256).
class byte_tokenizer final : public tokenizer {
 public:
  /// First line of the saved file.
  static constexpr const char* header = "longwave-byte 1";

  /// Parses the contents of a saved byte tokenizer; `path` is only used in error messages.
  /// Throws lw_error(corrupt_data) naming path:line if anything but the header line is present.
  static byte_tokenizer parse(std::string_view text, const std::string& path);

  int64_t vocab_size() const override { return 256; }
  std::vector<uint16_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<uint16_t>& tokens) const override;
  std::string kind() const override { return "byte"; }
  void save(const std::string& path) const override;
  std::string text() const override;
};

}  // namespace longwave::models::data
