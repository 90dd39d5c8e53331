// The safetensors writer: JSON header with RapidJSON, the file through the data pipeline's atomic write.
#include "models/safetensors.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <set>
#include <stdexcept>
#include <string_view>

#include "models/data/file_io.hpp"

// The format stores little-endian values; the tensors' bytes are written as they are in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors writer assumes a little-endian host");

namespace longwave::models {

int64_t safetensor_view::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

void write_string(rapidjson::Writer<rapidjson::StringBuffer>& w, const std::string& s) {
  w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
}

}  // namespace

std::string safetensors_prefix(const std::vector<safetensor_view>& tensors,
                               const std::vector<std::pair<std::string, std::string>>& metadata) {
  rapidjson::StringBuffer text;
  rapidjson::Writer<rapidjson::StringBuffer> w(text);
  std::set<std::string> seen;
  w.StartObject();
  if (!metadata.empty()) {
    w.Key("__metadata__");
    w.StartObject();
    for (const auto& [k, v] : metadata) {
      write_string(w, k);
      write_string(w, v);
    }
    w.EndObject();
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
      throw std::invalid_argument("safetensors: tensor name '" + t.name + "' is empty, reserved or repeated");
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * sizeof(float);
    write_string(w, t.name);
    w.StartObject();
    w.Key("dtype");
    w.String("F32");
    w.Key("shape");
    w.StartArray();
    for (auto d : t.shape) w.Int64(d);
    w.EndArray();
    w.Key("data_offsets");
    w.StartArray();
    w.Uint64(offset);
    w.Uint64(offset + bytes);
    w.EndArray();
    w.EndObject();
    offset += bytes;
  }
  w.EndObject();
  std::string header(text.GetString(), text.GetSize());
  header.append((8 - header.size() % 8) % 8, ' ');  // 8 + header: the data starts 8-aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header;
}

uint64_t write_safetensors(const std::string& path, const std::vector<safetensor_view>& tensors,
                           const std::vector<std::pair<std::string, std::string>>& metadata) {
  const std::string prefix = safetensors_prefix(tensors, metadata);
  std::vector<std::string_view> parts{prefix};
  uint64_t size = prefix.size();
  for (const auto& t : tensors) {
    const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(float);
    parts.emplace_back(reinterpret_cast<const char*>(t.data), bytes);
    size += bytes;
  }
  data::write_file_atomic(path, parts);
  return size;
}

}  // namespace longwave::models
