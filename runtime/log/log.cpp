// Default spdlog logger: stdout, "[hh:mm:ss] message", level shown only for warnings and errors.
#include "runtime/log/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace longwave::runtime {

void init_logging(const std::string& level) {
  static bool done = false;
  if (!done) {
    auto logger = spdlog::stdout_logger_mt("longwave");
    logger->set_pattern("[%H:%M:%S] %v");
    spdlog::set_default_logger(logger);
    spdlog::flush_on(spdlog::level::info);
    done = true;
  }
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace longwave::runtime
