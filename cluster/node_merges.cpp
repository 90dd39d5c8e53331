// A node's side of asynchronous merges (see node_merges.hpp).
#include "cluster/node_merges.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace longwave::cluster {

void merge_follower::push(uint64_t v_start, uint64_t tokens) {
  std::lock_guard<std::mutex> lk(mu_);
  queued_.push_back({v_start, tokens, ++pushed_});
}

bool merge_follower::answers(const merge_msg& m) const {
  const auto mine = [this](const merge_entry& e) { return e.node == name_; };
  return std::any_of(m.merged.begin(), m.merged.end(), mine) ||
         std::any_of(m.dropped.begin(), m.dropped.end(), mine);
}

void merge_follower::on_tick(const master_asks& asks, control_client& control,
                             const actors::node_controls& controls) {
  for (const auto& m : asks.merges) {
    // A merge told again (after a takeover or a dropped link) answered what it names the first time; the
    // contribution unanswered now is a later one.
    const bool again = !m.merged.empty() && (m.version <= forgotten_ || told_.count(m.version) != 0);
    if (answers(m) && !again) unanswered_.reset();
    if (!m.merged.empty() && m.version > forgotten_) told_.emplace(m.version, m);
    if (controls.merge) controls.merge(m);
  }
  if (asks.welcomed && unanswered_) {
    spdlog::info("node {}: contributing again from version {} (its last contribution had no answer)", name_,
                 unanswered_->v_start);
    control.contribute(*unanswered_);
  }
  std::vector<contribute_msg> queued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queued.swap(queued_);
  }
  for (const auto& c : queued) {
    control.contribute(c);
    unanswered_ = c;
  }
}

std::vector<merge_msg> merge_follower::unapplied(uint64_t applied) {
  forgotten_ = std::max(forgotten_, applied);
  told_.erase(told_.begin(), told_.upper_bound(forgotten_));
  std::vector<merge_msg> out;
  for (const auto& [v, m] : told_) out.push_back(m);
  return out;
}

}  // namespace longwave::cluster
