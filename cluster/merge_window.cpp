// The master's asynchronous merge rule: quorum, adaptive grace window, staleness cap (merge_window.hpp).
#include "cluster/merge_window.hpp"

#include <algorithm>

namespace longwave::cluster {

namespace {

/// A node due at its mean interval is waited for a tenth of that interval more: arrivals jitter.
constexpr double due_margin = 0.1;

}  // namespace

const char* to_string(window_phase p) {
  switch (p) {
    case window_phase::gathering: return "gathering";
    case window_phase::grace: return "grace";
  }
  return "?";
}

const char* to_string(drop_reason r) {
  switch (r) {
    case drop_reason::stale: return "stale";
    case drop_reason::left: return "left";
    case drop_reason::not_member: return "not_member";
    case drop_reason::future_version: return "future_version";
    case drop_reason::past_end: return "past_end";
  }
  return "?";
}

merge_window::merge_window(merge_rules rules, int64_t version, int64_t applied)
    : rules_(rules), version_(version), applied_(std::min(applied, version)) {}

int64_t merge_window::effective_quorum() const {
  return std::max<int64_t>(1, std::min<int64_t>(rules_.quorum, static_cast<int64_t>(members_.size())));
}

std::vector<drop> merge_window::set_members(const std::set<std::string>& members, double now_s) {
  std::vector<drop> dropped;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (members.count(it->first) != 0) {
      ++it;
      continue;
    }
    dropped.push_back({it->second, drop_reason::left, version_ - it->second.v_start});
    it = pending_.erase(it);
  }
  for (auto it = cadence_.begin(); it != cadence_.end();)
    it = members.count(it->first) ? std::next(it) : cadence_.erase(it);
  members_ = members;
  const auto enough = static_cast<int64_t>(pending_.size()) >= effective_quorum();
  if (phase_ == window_phase::grace && !enough) {
    phase_ = window_phase::gathering;  // the quorum left with its nodes
    waited_.clear();
    closes_s_ = std::numeric_limits<double>::infinity();
  } else if (phase_ == window_phase::gathering && enough && !pending_.empty()) {
    open(now_s);  // a smaller membership lowered the quorum
  }
  note_all_in(now_s);  // a waited node that left is no longer waited for
  return dropped;
}

std::optional<drop> merge_window::arrive(const contribution& c, double now_s) {
  const int64_t staleness = version_ - c.v_start;
  if (members_.count(c.node) == 0) return drop{c, drop_reason::not_member, staleness};
  if (staleness < 0) return drop{c, drop_reason::future_version, staleness};
  // Answered, not kept: a node that holds an older version learns that it missed the merges to the end.
  if (rules_.last_version > 0 && version_ >= rules_.last_version)
    return drop{c, drop_reason::past_end, staleness};
  // The pending report again: a node re-sends its unanswered one on a welcome (its link dropped), and holds
  // later phases back until one is answered, so this is no new phase.
  if (const auto it = pending_.find(c.node);
      it != pending_.end() && it->second.v_start == c.v_start && it->second.tokens == c.tokens)
    return std::nullopt;
  auto& cad = cadence_[c.node];
  if (cad.last_s >= 0) {
    const double interval = now_s - cad.last_s;
    cad.period_s = cad.period_s > 0 ? 0.5 * cad.period_s + 0.5 * interval : interval;
  }
  cad.last_s = now_s;
  if (staleness > rules_.max_staleness) return drop{c, drop_reason::stale, staleness};
  auto [it, fresh] = pending_.try_emplace(c.node, c);
  if (!fresh) {
    it->second.tokens += c.tokens;
    it->second.v_start = std::min(it->second.v_start, c.v_start);
    it->second.parts += c.parts;
  }
  if (phase_ == window_phase::gathering && static_cast<int64_t>(pending_.size()) >= effective_quorum())
    open(now_s);
  note_all_in(now_s);
  return std::nullopt;
}

std::optional<double> merge_window::due_in(const std::string& node, double now_s) const {
  if (pending_.count(node) != 0) return std::nullopt;
  const auto it = cadence_.find(node);
  if (it == cadence_.end() || it->second.period_s <= 0) return std::nullopt;  // no cadence known yet
  return it->second.last_s + it->second.period_s - now_s;
}

void merge_window::open(double now_s) {
  phase_ = window_phase::grace;
  opened_s_ = now_s;
  waited_.clear();
  double wait = 0;
  for (const auto& node : members_) {
    const auto due = due_in(node, now_s);
    if (!due || *due > rules_.grace_max_s) continue;
    waited_.insert(node);
    wait = std::max(wait, *due + due_margin * cadence_.at(node).period_s);
  }
  closes_s_ = now_s + std::clamp(wait, rules_.grace_min_s, std::max(rules_.grace_min_s, rules_.grace_max_s));
  all_in_s_ = std::numeric_limits<double>::infinity();
  note_all_in(now_s);
}

void merge_window::note_all_in(double now_s) {
  if (phase_ == window_phase::grace && all_in_s_ > now_s && waited_all_in()) all_in_s_ = now_s;
}

double merge_window::due_at() const {
  return waited_all_in() ? std::min(closes_s_, std::max(opened_s_ + rules_.grace_min_s, all_in_s_))
                         : closes_s_;
}

bool merge_window::waited_all_in() const {
  return std::all_of(waited_.begin(), waited_.end(),
                     [&](const std::string& n) { return pending_.count(n) != 0 || members_.count(n) == 0; });
}

bool merge_window::held() const {
  return (rules_.max_in_flight > 0 && version_ - applied_ >= rules_.max_in_flight) ||
         (rules_.last_version > 0 && version_ >= rules_.last_version);
}

void merge_window::applied(int64_t version) {
  applied_ = std::max(applied_, std::min(version, version_));
}

double merge_window::closes_at() const {
  if (phase_ != window_phase::grace || held()) return std::numeric_limits<double>::infinity();
  return due_at();
}

std::optional<merge> merge_window::poll(double now_s) {
  if (phase_ != window_phase::grace || held() || now_s < closes_at()) return std::nullopt;
  merge m{version_ + 1, {}, opened_s_, std::min(now_s, due_at()), now_s};
  m.merged.reserve(pending_.size());
  for (auto& [node, c] : pending_) m.merged.push_back(c);  // std::map: name order
  ++version_;
  pending_.clear();
  waited_.clear();
  phase_ = window_phase::gathering;
  closes_s_ = std::numeric_limits<double>::infinity();
  return m;
}

}  // namespace longwave::cluster
