#include "actors/round/adaptive_steps.hpp"

#include <algorithm>
#include <cmath>

namespace longwave::actors {

int64_t adaptive_steps(int64_t H, int64_t floor, double own_step_s, double fastest_step_s) {
  if (!(own_step_s > 0) || !(fastest_step_s > 0) || own_step_s <= fastest_step_s * 1.05) return H;
  const auto fit = static_cast<int64_t>(std::lround(static_cast<double>(H) * fastest_step_s / own_step_s));
  return std::clamp(fit, std::min(floor, H), H);
}

double fastest_step(const std::vector<comm::rank_note>& notes, double own_step_s) {
  double fastest = own_step_s > 0 ? own_step_s : 0.0;
  for (const auto& n : notes)
    if (n.step_seconds > 0 && (fastest == 0 || n.step_seconds < fastest)) fastest = n.step_seconds;
  return fastest;
}

double round_weight(int64_t workers, int64_t h, int64_t H) {
  return static_cast<double>(workers) * static_cast<double>(h) / static_cast<double>(H);
}

double contributing_workers(const std::vector<comm::rank_note>& notes) {
  double n = 0;
  for (const auto& note : notes) n += std::round(note.contributors);
  return n;
}

}  // namespace longwave::actors
