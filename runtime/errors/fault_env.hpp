#pragma once
// Test faults read from the environment (LONGWAVE_FAULT_*): a delay in seconds.
#include <cstdlib>
#include <string>

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

}  // namespace longwave::runtime
