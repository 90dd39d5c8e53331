// Default spdlog logger, "[hh:mm:ss] message": information on stdout, warnings and errors on stderr, so that
// `longwave run --dry-run > resolved.toml` still shows them; all on stderr where stdout is a product.
#include "runtime/log/log.hpp"

#include <cmath>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <mutex>
#include <vector>

namespace longwave::runtime {

namespace {

/// stdout's sink for the messages below warnings.
class below_warnings final : public spdlog::sinks::stdout_sink_mt {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn) spdlog::sinks::stdout_sink_mt::log(msg);
  }
};

/// Keeps the first error line: the cause a node reports to its coordinator when it fails (the errors after
/// it are mostly its consequences).
class first_error_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string first() {
    std::lock_guard<std::mutex> hold(mutex_);
    return first_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::err && first_.empty())
      first_.assign(msg.payload.begin(), msg.payload.end());
  }
  void flush_() override {}

 private:
  std::string first_;
};

std::shared_ptr<first_error_sink> first_errors() {
  static const auto sink = std::make_shared<first_error_sink>();
  return sink;
}

void install(std::vector<spdlog::sink_ptr> sinks) {
  sinks.push_back(first_errors());
  auto logger = std::make_shared<spdlog::logger>("longwave", sinks.begin(), sinks.end());
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

std::string first_error_logged() {
  return first_errors()->first();
}

void information_to_stderr() {
  install({std::make_shared<spdlog::sinks::stderr_sink_mt>()});
}

std::string readable(double v, int decimals) {
  return std::abs(v) >= 1e9 ? fmt::format("{:.4g}", v) : fmt::format("{:.{}f}", v, decimals);
}

}  // namespace longwave::runtime
