#pragma once
// Test faults read from the environment (LONGWAVE_FAULT_*): a delay in seconds, a hold before the exit.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "runtime/errors/errors.hpp"

namespace longwave::runtime {

/// The seconds the environment variable `name` gives (0 when it is unset or empty). Throws
/// lw_error(invalid_config) naming it when it is not a number of seconds from 0 to 3600.
inline double fault_seconds(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s >= 0) || s > 3600)
    throw lw_error(errc::invalid_config, std::string(name) + "=" + v + ": want seconds, from 0 to 3600");
  return s;
}

/// LONGWAVE_FAULT_SLOW_EXIT_S (tests): an ended process waits that long before it exits with `code`, for a
/// test's late signal to meet it. A bad value is said and ignored (the run has ended already).
inline void hold_before_exit(int code) {
  double s = 0;
  try {
    s = fault_seconds("LONGWAVE_FAULT_SLOW_EXIT_S");
  } catch (const lw_error& e) {
    spdlog::warn("{}; ignored", e.what());
  }
  if (s <= 0) return;
  spdlog::warn("LONGWAVE_FAULT_SLOW_EXIT_S: the process waits {} s before it exits with code {}", s, code);
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace longwave::runtime
