#include "runtime/process/stop_signals.hpp"

#include <csignal>
#include <cstdlib>

#include "runtime/errors/fault_env.hpp"

namespace longwave::runtime {

namespace {

std::atomic<int>* g_count = nullptr;
std::atomic<bool> g_hung_up{false};
struct sigaction g_before[3];
constexpr int signals[3] = {SIGINT, SIGTERM, SIGHUP};

std::atomic<int> g_exit_code{130};

void on_late_signal(int /*sig*/) {
  std::_Exit(g_exit_code.load());
}

void on_stop(int sig) {
  if (sig == SIGHUP && g_hung_up.exchange(true)) return;
  if (g_count) g_count->fetch_add(1);
}

}  // namespace

void count_stop_signals(std::atomic<int>& count) {
  g_count = &count;
  g_hung_up = false;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  for (int i = 0; i < 3; ++i) {
    sigaction(signals[i], nullptr, &g_before[i]);
    if (signals[i] == SIGHUP && g_before[i].sa_handler == SIG_IGN) continue;
    sigaction(signals[i], &sa, nullptr);
  }
}

void uncount_stop_signals() {
  for (int i = 0; i < 3; ++i) sigaction(signals[i], &g_before[i], nullptr);
}

signal_handler late_signal() {
  return on_late_signal;
}

void keep_exit_code(int code) {
  g_exit_code = code;
}

int end_with(int code) {
  keep_exit_code(code);
  for (const int sig : {SIGINT, SIGTERM})
    if (std::signal(sig, on_late_signal) == SIG_IGN) std::signal(sig, SIG_IGN);
  hold_before_exit(code);
  return code;
}

}  // namespace longwave::runtime
