#pragma once
// Test helper for hostile peers: sends a message of raw frames (forged headers and payloads) on a ZeroMQ
// socket, as a ring's previous rank would send a chunk.
#include <cstddef>
#include <vector>
#include <zmq.hpp>

namespace longwave::test {

/// Sends frames as one multipart message.
inline void send_frames(zmq::socket_t& socket, const std::vector<std::vector<std::byte>>& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    socket.send(zmq::buffer(frames[i].data(), frames[i].size()),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

}  // namespace longwave::test
