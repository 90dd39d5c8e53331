// The control plane's text helpers (see control_text.hpp).
#include "cluster/control_text.hpp"

#include <fmt/format.h>

namespace longwave::cluster::control {

std::string secs(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", static_cast<double>(ms.count()) / 1000.0);
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace longwave::cluster::control
