// The control socket's helpers (see control_common.hpp).
#include "cluster/control_common.hpp"

#include <fmt/format.h>

#include <cerrno>

namespace longwave::cluster::control {

zmq::message_t to_message(const std::vector<std::byte>& bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

bool readable(zmq::socket_t& sock, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{static_cast<void*>(sock), 0, ZMQ_POLLIN, 0};
  try {
    zmq::poll(&item, 1, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
  return (item.revents & ZMQ_POLLIN) != 0;
}

}  // namespace longwave::cluster::control
