// The control socket's helpers (see control_common.hpp).
#include "comm/control_common.hpp"

#include <fmt/format.h>

#include <cerrno>

namespace longwave::comm::control {

std::string secs(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", static_cast<double>(ms.count()) / 1000.0);
}

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

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace longwave::comm::control
