#pragma once
// Reading a ZeroMQ socket monitor (zmq_socket_monitor): the event id and the peer address of each event.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <zmq.hpp>

namespace longwave::comm {

/// One monitor event: ZMQ_EVENT_* and the endpoint it concerns.
struct monitor_event {
  uint16_t id = 0;
  std::string address;
};

/// The next event waiting on a monitor socket (PAIR connected to the monitor endpoint), or nothing.
inline std::optional<monitor_event> next_monitor_event(zmq::socket_t& monitor) {
  for (;;) {
    zmq::message_t event;
    if (!monitor.recv(event, zmq::recv_flags::dontwait)) return std::nullopt;
    zmq::message_t address;
    if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
    if (event.size() < 6) continue;  // u16 event id + u32 value
    monitor_event e;
    std::memcpy(&e.id, event.data(), sizeof e.id);
    e.address = address.to_string();
    return e;
  }
}

}  // namespace longwave::comm
