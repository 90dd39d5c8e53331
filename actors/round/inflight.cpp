// In-flight all-reduce bookkeeping.
#include "actors/round/inflight.hpp"

#include <vector>

namespace longwave::actors {

void inflight_reduces::arrived(const ring_label& label, const at::Tensor& avg,
                               std::vector<std::string> members) {
  running_.erase(label);
  averages_[label] = avg;
  members_[label] = std::move(members);
  auto range = waiting_.equal_range(label);
  std::vector<waiter> ready;
  for (auto it = range.first; it != range.second; ++it) ready.push_back(std::move(it->second));
  waiting_.erase(range.first, range.second);
  for (auto& w : ready) w(avg);  // a waiter may queue new waiters: the map is already consistent
}

void inflight_reduces::when(const ring_label& label, waiter w) {
  if (has_average(label)) return w(averages_.at(label));
  waiting_.emplace(label, std::move(w));
}

}  // namespace longwave::actors
