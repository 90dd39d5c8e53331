#pragma once
// Test helper for hostile peers: sends a message of raw frames (forged headers and payloads) on a ZeroMQ
// socket, as a ring's previous rank would send a chunk.
#include <cstddef>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace longwave::test {

/// Sends frames as one multipart message.
inline void send_frames(zmq::socket_t& socket, const std::vector<std::vector<std::byte>>& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    socket.send(zmq::buffer(frames[i].data(), frames[i].size()),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

/// Plain (no CURVE) sockets aimed at a cluster: a PUSH to each ring port on 127.0.0.1, and a DEALER to
/// the coordinator's endpoint; none lingers or blocks a send more than 100 ms.
struct raw_peer {
  raw_peer(const std::vector<int>& ring_ports, const std::string& coordinator)
      : control(ctx, zmq::socket_type::dealer) {
    for (int p : ring_ports) {
      ring.emplace_back(ctx, zmq::socket_type::push);
      ring.back().set(zmq::sockopt::linger, 0);
      ring.back().set(zmq::sockopt::sndtimeo, 100);
      ring.back().connect("tcp://127.0.0.1:" + std::to_string(p));
    }
    control.set(zmq::sockopt::linger, 0);
    control.set(zmq::sockopt::sndtimeo, 100);
    control.connect(coordinator);
  }
  zmq::context_t ctx;
  std::vector<zmq::socket_t> ring;
  zmq::socket_t control;
};

}  // namespace longwave::test
