#pragma once
// Pieces the master (cluster/master.cpp) and the node's control_client (cluster/control_client.cpp)
// share: the control socket's helpers (and, through cluster/control_text.hpp, timings and text helpers).
#include <chrono>
#include <cstddef>
#include <vector>
#include <zmq.hpp>

#include "cluster/control_text.hpp"

namespace longwave::cluster::control {

zmq::message_t to_message(const std::vector<std::byte>& bytes);

/// zmq::poll on one socket for reading; false on timeout or a signal (EINTR), which the callers' loops
/// recheck.
bool readable(zmq::socket_t& sock, std::chrono::milliseconds timeout);

}  // namespace longwave::cluster::control
