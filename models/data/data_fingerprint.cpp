// The training data's fingerprint (see data_fingerprint.hpp).
#include "models/data/data_fingerprint.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>
#include <vector>

#include "runtime/checksum/crc32c.hpp"
#include "runtime/checksum/splitmix64.hpp"

namespace longwave::models::data {

namespace {

constexpr uint64_t sample_bytes = 1 << 20;

/// Size and CRC-32C of the first, middle and last sample_bytes of one file (nullopt: unreadable).
std::optional<uint64_t> file_fingerprint(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const uint64_t middle = size > sample_bytes ? size / 2 - sample_bytes / 2 : 0;
  const uint64_t last = size > sample_bytes ? size - sample_bytes : 0;
  uint32_t crc = 0;
  std::vector<char> buf(sample_bytes);
  for (const uint64_t at : {uint64_t{0}, middle, last}) {
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(std::min<uint64_t>(sample_bytes, size - at)));
    if (in.bad()) return std::nullopt;
    crc = runtime::crc32c(buf.data(), static_cast<size_t>(in.gcount()), crc);
    in.clear();
  }
  return runtime::splitmix64(size ^ (uint64_t{crc} << 32));
}

}  // namespace

uint64_t data_fingerprint(const std::string& input_path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files{input_path};
  if (std::error_code ec; fs::is_directory(input_path, ec))
    files = {fs::path(input_path) / "train.bin", fs::path(input_path) / "val.bin"};
  uint64_t out = 0;
  for (const auto& f : files) {
    const auto fp = file_fingerprint(f);
    if (!fp) return 0;
    out = runtime::splitmix64(out ^ *fp);
  }
  return out == 0 ? 1 : out;
}

}  // namespace longwave::models::data
