#pragma once
// Process-wide logging on spdlog: one "longwave" logger writing progress lines to stdout.
#include <spdlog/spdlog.h>

#include <string>

namespace longwave::runtime {

/// Installs the default logger (idempotent). level: "trace".."error".
void init_logging(const std::string& level = "info");

}  // namespace longwave::runtime
