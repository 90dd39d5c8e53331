// Framing checks and Cap'n Proto helpers shared by every frame reader (see capnp_frame.hpp).
#include "comm/capnp_frame.hpp"

#include <fmt/format.h>

#include <cstring>

namespace longwave::comm {

rejection reject(reject_reason r, std::string detail) {
  return rejection{r, std::move(detail)};
}

frame_result<aligned_frame> check_framing(const void* data, size_t size, size_t max_bytes, const char* what) {
  if (size < 8)
    return reject(reject_reason::truncated,
                  fmt::format("{} frame has {} bytes, less than one word", what, size));
  if (size > max_bytes)
    return reject(reject_reason::bad_size,
                  fmt::format("{} frame has {} bytes, limit {}", what, size, max_bytes));
  if (size % 8 != 0)
    return reject(
        reject_reason::bad_size,
        fmt::format("{} frame has {} bytes, not a multiple of 8 (not an unpacked Cap'n Proto message)", what,
                    size));
  aligned_frame f;
  f.words = kj::heapArray<capnp::word>(size / 8);
  std::memcpy(f.words.begin(), data, size);
  const auto* bytes = reinterpret_cast<const unsigned char*>(f.words.begin());
  uint32_t first = 0;
  std::memcpy(&first, bytes, 4);
  const uint64_t n_segments = uint64_t{first} + 1;
  constexpr uint64_t max_segments = 16;
  if (n_segments > max_segments)
    return reject(reject_reason::malformed,
                  fmt::format("{} frame declares {} segments, limit {}", what, n_segments, max_segments));
  const uint64_t table_words = (4 + 4 * n_segments + 7) / 8;
  const uint64_t words = size / 8;
  if (table_words > words)
    return reject(reject_reason::truncated,
                  fmt::format("{} frame of {} bytes is shorter than its segment table", what, size));
  uint64_t body_words = 0;
  for (uint64_t s = 0; s < n_segments; ++s) {
    uint32_t w = 0;
    std::memcpy(&w, bytes + 4 + 4 * s, 4);
    body_words += w;
  }
  if (table_words + body_words > words)
    return reject(reject_reason::truncated,
                  fmt::format("{} frame has {} bytes but its segment table needs {}", what, size,
                              8 * (table_words + body_words)));
  if (table_words + body_words < words)
    return reject(reject_reason::bad_size,
                  fmt::format("{} frame has {} bytes but its segment table accounts for {}", what, size,
                              8 * (table_words + body_words)));
  if (body_words == 0) return reject(reject_reason::malformed, fmt::format("{} frame has no root", what));
  return f;
}

capnp::ReaderOptions reader_options(size_t words, int nesting) {
  capnp::ReaderOptions o;
  // Legitimate messages are read once; 4x the frame plus a little leaves room for default-struct reads
  // while stopping amplification through shared pointers.
  o.traversalLimitInWords = 4 * words + 64;
  o.nestingLimit = nesting;
  return o;
}

bool known_dtype(uint16_t v) {
  return v <= static_cast<uint16_t>(wire_dtype::sparse);
}

wire::Dtype to_wire(wire_dtype d) {
  return static_cast<wire::Dtype>(static_cast<uint16_t>(d));
}

std::string kj_text(const kj::Exception& e) {
  return std::string(e.getDescription().cStr());
}

capnp::Text::Reader txt(const std::string& s) {
  return capnp::Text::Reader(s.c_str(), s.size());
}

std::string text_of(capnp::Text::Reader t) {
  return std::string(t.cStr(), t.size());
}

std::optional<rejection> check_text(capnp::Text::Reader t, size_t limit, const char* field) {
  if (t.size() > limit)
    return reject(reject_reason::bad_size, fmt::format("{} has {} bytes, limit {}", field, t.size(), limit));
  return std::nullopt;
}

}  // namespace longwave::comm
