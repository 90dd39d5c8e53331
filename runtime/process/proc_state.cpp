// A child's state from /proc/PID/stat (runtime/process/proc_state.hpp).
#include "runtime/process/proc_state.hpp"

#include <fstream>
#include <string>

namespace longwave::runtime {

bool is_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const auto close = stat.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'T' || state == 't';
}

}  // namespace longwave::runtime
