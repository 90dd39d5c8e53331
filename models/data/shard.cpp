// Token shards in llm.c's .bin format: a header of 256 little-endian int32 (magic 20240520, version 1, token
// count), then the tokens as little-endian uint16.
#include "models/data/shard.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "models/data/file_io.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

namespace {

bool host_is_little_endian() {
  const uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

int32_t load_le32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

void store_le32(unsigned char* p, int32_t v) {
  auto u = static_cast<uint32_t>(v);
  for (int k = 0; k < 4; ++k) p[k] = static_cast<unsigned char>(u >> (8 * k));
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw lw_error(errc::corrupt_data, fmt::format("token shard '{}': {}", path, what));
}

// Validates the header against the file size; returns the token count.
int64_t check_header(const std::string& path, const unsigned char* header, int64_t file_bytes) {
  const int32_t magic = load_le32(header);
  if (magic != shard_magic) corrupt(path, fmt::format("bad magic {} (expected {})", magic, shard_magic));
  const int32_t version = load_le32(header + 4);
  if (version != shard_version) {
    corrupt(path,
            fmt::format("unsupported version {} (expected {}: uint16 tokens){}", version, shard_version,
                        version == 2 ? "; version 2 holds uint32 tokens, which longwave does not read" : ""));
  }
  const int32_t count = load_le32(header + 8);
  if (count < 0) corrupt(path, fmt::format("negative token count {} in header", count));
  const int64_t held_bytes = file_bytes - shard_header_bytes;
  if (held_bytes != 2 * static_cast<int64_t>(count)) {
    corrupt(path, fmt::format("header says {} tokens but file holds {}{}", count, held_bytes / 2,
                              held_bytes % 2 != 0 ? " and a stray byte" : ""));
  }
  return count;
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw lw_error(errc::io_error, fmt::format("cannot write token shard '{}': {} tokens exceed the format's "
                                               "int32 count; split the data into several shards",
                                               path, tokens.size()));
  }
  unsigned char header[shard_header_bytes] = {};
  store_le32(header, shard_magic);
  store_le32(header + 4, shard_version);
  store_le32(header + 8, static_cast<int32_t>(tokens.size()));
  std::string swapped;  // only used on big-endian hosts
  std::string_view body(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  if (!host_is_little_endian()) {
    swapped.resize(tokens.size() * 2);
    for (size_t i = 0; i < tokens.size(); ++i) {
      swapped[2 * i] = static_cast<char>(tokens[i] & 0xFF);
      swapped[2 * i + 1] = static_cast<char>(tokens[i] >> 8);
    }
    body = swapped;
  }
  write_file_atomic(path, {std::string_view(reinterpret_cast<const char*>(header), sizeof header), body});
}

std::vector<uint16_t> read_shard(const std::string& path) {
  const std::string bytes = read_file(path, "token shard");
  const auto n_bytes = static_cast<int64_t>(bytes.size());
  if (n_bytes < shard_header_bytes) {
    corrupt(path,
            fmt::format("file is {} bytes, shorter than the {}-byte header", n_bytes, shard_header_bytes));
  }
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const int64_t count = check_header(path, data, n_bytes);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  const unsigned char* p = data + shard_header_bytes;
  if (tokens.empty()) return tokens;  // data() may be null: no memcpy
  if (host_is_little_endian()) {
    std::memcpy(tokens.data(), p, tokens.size() * 2);
  } else {
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
  }
  return tokens;
}

void check_token_ids(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& path) {
  const auto bad = std::find_if(tokens.begin(), tokens.end(), [&](uint16_t t) { return t >= vocab; });
  if (bad == tokens.end()) return;
  corrupt(path, fmt::format("token id {} at position {} is outside the model's vocabulary of {} (ids 0..{}): "
                            "the shard was made with another tokenizer, or model.vocab_size is too small",
                            *bad, bad - tokens.begin(), vocab, vocab - 1));
}

int64_t read_shard_token_count(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw lw_error(errc::io_error, fmt::format("cannot read token shard '{}': it is a directory", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw lw_error(errc::io_error,
                   fmt::format("cannot open token shard '{}': {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const auto n_bytes = static_cast<int64_t>(in.tellg());
  if (n_bytes < 0) throw lw_error(errc::io_error, fmt::format("cannot read token shard '{}'", path));
  if (n_bytes < shard_header_bytes) {
    corrupt(path,
            fmt::format("file is {} bytes, shorter than the {}-byte header", n_bytes, shard_header_bytes));
  }
  unsigned char header[shard_header_bytes];
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(header), sizeof header)) {
    throw lw_error(errc::io_error, fmt::format("cannot read the header of token shard '{}'", path));
  }
  return check_header(path, header, n_bytes);
}

}  // namespace longwave::models::data
