// A child's state from /proc/PID/stat (runtime/process/proc_state.hpp).
#include "runtime/process/proc_state.hpp"

#include <fstream>
#include <string>

namespace longwave::runtime {

namespace {

/// The state letter of /proc/PID/stat; 0 when it cannot be read.
char state_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  const auto close = stat.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

}  // namespace

bool is_stopped(pid_t pid) {
  const char state = state_of(pid);
  return state == 'T' || state == 't';
}

bool has_exited(pid_t pid) {
  const char state = state_of(pid);
  return state == 0 || state == 'Z' || state == 'X';
}

}  // namespace longwave::runtime
