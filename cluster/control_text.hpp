#pragma once
// The control plane's socket-free pieces: timings and the text helpers of its lines (the master's state
// machine, cluster/master_state.hpp, uses them without ZeroMQ).
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace longwave::cluster::control {

using clock = std::chrono::steady_clock;
constexpr uint32_t no_rank = 0xffffffffu;
/// A node re-sends its hello this often while it waits for its welcome.
constexpr auto hello_every = std::chrono::seconds(2);
/// Dropped control messages, refused handshakes and refused state requests: the first 50 are logged, then
/// every 1000th (all are counted).
inline constexpr uint64_t logged_drops = 50, drop_log_every = 1000;

/// "1.5 s".
std::string secs(std::chrono::milliseconds ms);

/// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

}  // namespace longwave::cluster::control
