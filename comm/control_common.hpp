#pragma once
// Pieces the coordinator role (comm/rendezvous.cpp) and the node's control_client (comm/control_client.cpp)
// share: the control socket's helpers and timings.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace longwave::comm::control {

using clock = std::chrono::steady_clock;
constexpr uint32_t no_rank = 0xffffffffu;
/// A node re-sends its hello this often while it waits for its welcome.
constexpr auto hello_every = std::chrono::seconds(2);

/// "1.5 s".
std::string secs(std::chrono::milliseconds ms);

zmq::message_t to_message(const std::vector<std::byte>& bytes);

/// zmq::poll on one socket for reading; false on timeout or a signal (EINTR), which the callers' loops
/// recheck.
bool readable(zmq::socket_t& sock, std::chrono::milliseconds timeout);

/// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

}  // namespace longwave::comm::control
