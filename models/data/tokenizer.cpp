// The factory functions for tokenizers: make a byte tokenizer, or load either kind from its saved file.
#include "models/data/tokenizer.hpp"

#include <fmt/format.h>

#include "models/data/bpe_tokenizer.hpp"
#include "models/data/byte_tokenizer.hpp"
#include "models/data/file_io.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

std::unique_ptr<tokenizer> make_byte_tokenizer() {
  return std::make_unique<byte_tokenizer>();
}

std::unique_ptr<tokenizer> load_tokenizer(const std::string& path) {
  return parse_tokenizer(read_file(path, "tokenizer"), path);
}

std::unique_ptr<tokenizer> parse_tokenizer(const std::string& text, const std::string& path) {
  std::string_view first(text);
  first = first.substr(0, first.find('\n'));
  if (!first.empty() && first.back() == '\r') first.remove_suffix(1);
  if (first == byte_tokenizer::header) {
    return std::make_unique<byte_tokenizer>(byte_tokenizer::parse(text, path));
  }
  if (first == bpe_tokenizer::header) {
    return std::make_unique<bpe_tokenizer>(bpe_tokenizer::parse(text, path));
  }
  std::string shown(first.substr(0, 40));
  throw lw_error(errc::corrupt_data,
                 fmt::format("tokenizer {}:1: unknown header '{}' (expected '{}' or '{}')", path, shown,
                             byte_tokenizer::header, bpe_tokenizer::header));
}

std::string tokenizer_label(const tokenizer& tok) {
  if (tok.kind() == "byte") return fmt::format("byte vocab={}", tok.vocab_size());
  const auto canonical = tok.text();
  return fmt::format("{} vocab={} crc32c={:08x}", tok.kind(), tok.vocab_size(),
                     runtime::crc32c(canonical.data(), canonical.size()));
}

}  // namespace longwave::models::data
