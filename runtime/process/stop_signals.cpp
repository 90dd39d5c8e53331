#include "runtime/process/stop_signals.hpp"

#include <csignal>

namespace longwave::runtime {

namespace {

std::atomic<int>* g_count = nullptr;
std::atomic<bool> g_hung_up{false};
struct sigaction g_before[3];
constexpr int signals[3] = {SIGINT, SIGTERM, SIGHUP};

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

}  // namespace longwave::runtime
