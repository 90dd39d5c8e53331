#pragma once
// Reading one Cap'n Proto message from a peer's frame without trusting it, and writing one: the framing
// checks Cap'n Proto would otherwise report as exceptions, reader limits, and text helpers. Shared by the
// data plane's chunk headers (comm/frame.cpp) and the control plane's frames (cluster/envelope.cpp,
// cluster/state_frames.cpp).
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <kj/array.h>
#include <kj/exception.h>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "comm/frame.hpp"
#include "comm/wire.capnp.h"

namespace longwave::comm {

rejection reject(reject_reason r, std::string detail);

/// A frame copied into word-aligned memory (ZeroMQ gives no alignment guarantee).
struct aligned_frame {
  kj::Array<capnp::word> words;
};

/// The framing checks before Cap'n Proto reads a frame: length a multiple of 8 and within max_bytes, at most
/// 16 segments, and a segment table whose sizes add up to exactly the frame length. `what` names the frame
/// in the rejection ("envelope", "chunk header", ...).
frame_result<aligned_frame> check_framing(const void* data, size_t size, size_t max_bytes, const char* what);

/// Traversal limit 4x the frame plus a little, and the given nesting limit.
capnp::ReaderOptions reader_options(size_t words, int nesting);

bool known_dtype(uint16_t v);
wire::Dtype to_wire(wire_dtype d);
/// A kj exception's description.
std::string kj_text(const kj::Exception& e);

template <class Builder>
std::vector<std::byte> flat_bytes(Builder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

capnp::Text::Reader txt(const std::string& s);
std::string text_of(capnp::Text::Reader t);
/// bad_size naming `field` when t is longer than limit.
std::optional<rejection> check_text(capnp::Text::Reader t, size_t limit, const char* field);

}  // namespace longwave::comm
