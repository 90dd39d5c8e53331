// The byte tokenizer: 256 tokens, token id = byte value. Saved as the single line "longwave-byte 1".
#include "models/data/byte_tokenizer.hpp"

#include <fmt/format.h>

#include "models/data/file_io.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

byte_tokenizer byte_tokenizer::parse(std::string_view text, const std::string& path) {
  std::string_view rest = text;
  int64_t line_no = 0;
  while (!rest.empty()) {
    ++line_no;
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line == header) continue;
    if (line_no == 1) {
      throw lw_error(errc::corrupt_data, fmt::format("tokenizer {}:1: expected '{}'", path, header));
    }
    if (!line.empty()) {
      throw lw_error(errc::corrupt_data,
                     fmt::format("tokenizer {}:{}: unexpected content after '{}'", path, line_no, header));
    }
  }
  if (line_no == 0) throw lw_error(errc::corrupt_data, fmt::format("tokenizer {} is empty", path));
  return byte_tokenizer{};
}

std::vector<uint16_t> byte_tokenizer::encode(std::string_view text) const {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string byte_tokenizer::decode(const std::vector<uint16_t>& tokens) const {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= 256) {
      throw lw_error(errc::corrupt_data,
                     fmt::format("byte tokenizer: token id {} at position {} is out of range (vocab 256)",
                                 tokens[i], i));
    }
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

std::string byte_tokenizer::text() const {
  return std::string(header) + "\n";
}

void byte_tokenizer::save(const std::string& path) const {
  write_file_atomic(path, {text()});
}

}  // namespace longwave::models::data
