#pragma once
// A writer of the safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw little-endian data. fp32 only; no torch.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace longwave::models {

/// One fp32 tensor to write: its name, shape and values (numel of `shape` floats at `data`, not owned).
struct safetensor_view {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;

  int64_t numel() const;
};

/// The file's first part: the u64 header length (little-endian) and the JSON header, padded with spaces so
/// the data starts at a multiple of 8. Tensors are laid out back to back in the given order; `metadata`
/// becomes "__metadata__" (string values). Throws std::invalid_argument on an empty or repeated name.
std::string safetensors_prefix(const std::vector<safetensor_view>& tensors,
                               const std::vector<std::pair<std::string, std::string>>& metadata);

/// Writes prefix and data to `path` atomically (`path`.tmp, fsync, rename, directory fsync); returns the
/// file's size in bytes. Throws lw_error(io_error) naming the file.
uint64_t write_safetensors(const std::string& path, const std::vector<safetensor_view>& tensors,
                           const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace longwave::models
