// Default spdlog logger, "[hh:mm:ss] message": information on stdout, warnings and errors on stderr, so that
// `longwave run --dry-run > resolved.toml` still shows them; all on stderr where stdout is a product.
#include "runtime/log/log.hpp"

#include <cmath>

#include <spdlog/sinks/stdout_sinks.h>

#include <memory>

namespace longwave::runtime {

namespace {

/// stdout's sink for the messages below warnings.
class below_warnings final : public spdlog::sinks::stdout_sink_mt {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn) spdlog::sinks::stdout_sink_mt::log(msg);
  }
};

void install(spdlog::sinks_init_list sinks) {
  auto logger = std::make_shared<spdlog::logger>("longwave", sinks);
  logger->set_pattern("[%H:%M:%S] %v");
  if (auto old = spdlog::default_logger()) logger->set_level(old->level());
  spdlog::set_default_logger(logger);
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace

void init_logging(const std::string& level) {
  static bool done = false;
  if (!done) {
    auto err = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    err->set_level(spdlog::level::warn);
    install({std::make_shared<below_warnings>(), err});
    done = true;
  }
  spdlog::set_level(spdlog::level::from_str(level));
}

void information_to_stderr() {
  install({std::make_shared<spdlog::sinks::stderr_sink_mt>()});
}

std::string readable(double v, int decimals) {
  return std::abs(v) >= 1e9 ? fmt::format("{:.4g}", v) : fmt::format("{:.{}f}", v, decimals);
}

}  // namespace longwave::runtime
