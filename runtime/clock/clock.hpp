#pragma once
// Wall-clock intervals on the steady clock, in seconds.
#include <chrono>

namespace longwave::runtime {

/// Seconds of wall time since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace longwave::runtime
