#pragma once
// The all-reduces a round engine runs in the background, by ring label, and what waits for their averages
// (an outer step, a snapshot). Plain bookkeeping: the coordinator starts the requests and reports replies.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/messages/messages.hpp"

namespace longwave::actors {

using runtime::ring_label;

class inflight_reduces {
 public:
  using waiter = std::function<void(at::Tensor)>;

  /// label's all-reduce was started.
  void started(const ring_label& label) { running_.insert(label); }
  /// Its average came, of the contributions of `members` (comm::collective::last_members; empty: not
  /// known): kept until taken, and handed to every waiter in the order they asked.
  void arrived(const ring_label& label, const at::Tensor& avg, std::vector<std::string> members = {});
  /// It failed: no longer running (its waiters stay, and are never called).
  void failed(const ring_label& label) {
    running_.erase(label);
    failed_.insert(label);
  }
  /// Whether label's all-reduce failed (its average will never come).
  bool has_failed(const ring_label& label) const { return failed_.count(label) > 0; }
  /// A resume installs an average that was in flight when the checkpoint was written.
  void restore(const ring_label& label, const at::Tensor& avg) { averages_[label] = avg; }

  bool running(const ring_label& label) const { return running_.count(label) > 0; }
  bool any_running() const { return !running_.empty(); }
  bool has_average(const ring_label& label) const { return averages_.count(label) > 0; }
  /// Running, or arrived and not taken yet.
  bool known(const ring_label& label) const { return running(label) || has_average(label); }

  /// Calls w with label's average now if it arrived, else when it arrives.
  void when(const ring_label& label, waiter w);
  /// Forgets an arrived average once it is applied (a snapshot must not carry it as pending).
  void take(const ring_label& label) {
    averages_.erase(label);
    members_.erase(label);
  }
  /// The nodes whose contributions label's average holds, until it is taken (empty: not known).
  std::vector<std::string> members(const ring_label& label) const {
    const auto it = members_.find(label);
    return it == members_.end() ? std::vector<std::string>{} : it->second;
  }
  const at::Tensor& average(const ring_label& label) const { return averages_.at(label); }

 private:
  std::map<ring_label, at::Tensor> averages_;
  std::map<ring_label, std::vector<std::string>> members_;
  std::set<ring_label> running_, failed_;
  std::multimap<ring_label, waiter> waiting_;
};

}  // namespace longwave::actors
