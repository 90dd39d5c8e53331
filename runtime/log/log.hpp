#pragma once
// Process-wide logging on spdlog: one "longwave" logger, progress lines on stdout, warnings and errors on
// stderr.
#include <spdlog/spdlog.h>

#include <string>

namespace longwave::runtime {

/// Installs the default logger (idempotent). level: "trace", "debug", "info", "warn" or "error" (the CLI
/// checks it; spdlog turns any other name into silence).
void init_logging(const std::string& level = "info");

/// Sends the information lines to stderr as well, for a command whose stdout is its product (eval's loss,
/// sample's text, presets' table), so that `> file` holds only that.
void information_to_stderr();

/// The first error line this process logged ("" if none): what a failed node tells its coordinator.
std::string first_error_logged();

/// A number for a progress line: `decimals` places, or 4 significant digits with an exponent from 1e9 on (a
/// diverged run's perplexity e^537 is not 230 digits).
std::string readable(double v, int decimals);

}  // namespace longwave::runtime
