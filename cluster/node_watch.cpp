// A training node's view of its master (see node_watch.hpp).
#include "cluster/node_watch.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "runtime/json/json_line.hpp"
#include "runtime/memory/allocator.hpp"

namespace longwave::cluster {

namespace {

/// The epoch view of a membership message.
comm::epoch_view view_of(const membership_msg& m) {
  comm::epoch_view v;
  v.epoch = m.epoch;
  v.rank = m.rank;
  for (const auto& p : m.peers) {
    v.names.push_back(p.name);
    v.endpoints.push_back(p.endpoint);
    if (!p.public_key.empty()) v.public_keys.push_back(p.public_key);
  }
  return v;
}

/// metrics.jsonl: membership over time, for `longwave report`.
std::string membership_record(const control_event& ev) {
  std::string members;
  for (const auto& p : ev.membership.peers) members += (members.empty() ? "" : ",") + p.name;
  return runtime::json_line("membership")
      .add("epoch", ev.epoch)
      .add("rank", static_cast<uint64_t>(ev.membership.rank))
      .add("members", members)
      .add("kept_round", ev.membership.commit.round)
      .add("kept_fragment", static_cast<uint64_t>(ev.membership.commit.fragment))
      .str();
}

/// What a control event asks of the node's main loop (leave, stop, pin), added to `asks`.
void add_ask(const control_event& ev, master_asks& asks) {
  asks.leave = asks.leave || ev.what == control_event::kind::leave;
  asks.welcomed = asks.welcomed || ev.what == control_event::kind::welcome;
  if (ev.what == control_event::kind::merge) asks.merges.push_back(ev.merge);
  if (ev.what == control_event::kind::notice && ev.code == errc::evicted) asks.evicted = ev.text;
  if (ev.what == control_event::kind::stop && ev.round == 0) asks.stop_query = true;
  if (ev.what == control_event::kind::stop && ev.round > 0) asks.stop_round = ev.round;
  if (ev.what != control_event::kind::pin) return;
  asks.pin_query = asks.pin_query || (ev.round == 0 && !ev.release);
  if (ev.round > 0) asks.pin_round = ev.round;
  asks.pin_release = asks.pin_release || ev.release;
}

}  // namespace

void admit_keys(const std::shared_ptr<comm::key_ring>& ring, const std::vector<peer_entry>& keys) {
  if (!ring) return;
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& k : keys)
    if (!k.public_key.empty()) entries.emplace_back(k.name, k.public_key);
  ring->assign(entries);
}

master_asks master_watch::on_tick(control_client& control, comm::collective& ring,
                                  comm::elastic_ring* elastic, const std::string& name,
                                  steady::time_point now, const std::function<void(std::string)>& record) {
  master_asks asks;
  const auto events = control.poll();
  // A coordinator that evicts this node (or calls the run off) and exits: its drop may come in the same poll,
  // before its last words.
  for (const auto& ev : events)
    if (ev.what == control_event::kind::notice && ev.code == errc::evicted) evicted_ = true;
  for (const auto& ev : events) {
    add_ask(ev, asks);
    // The new membership's keys first, then its ring.
    if (ev.what == control_event::kind::membership) admit_keys(admitted_, ev.membership.keys);
    on_event(ev, ring, elastic, name, now);
    if (ev.what == control_event::kind::membership) record(membership_record(ev));
  }
  asks.known_again = std::exchange(known_again_, false);
  // Merges of this poll are told of before a re-announcement in it names them (merges_told comes next tick).
  for (const auto& m : asks.merges)
    if (!m.merged.empty() && (told_.empty() || m.version > told_.back().version)) told_.push_back(m);
  if (elastic && reannounce_ && now >= next_announce_) reannounce(control, *elastic, now);
  if (elastic) report(control, *elastic, name, now);
  if (elastic)
    if (auto why = cut_off_.due(gone_since_, now)) {
      spdlog::error("node {}: {}", name, *why);
      elastic->evict(*why);
      asks.cut_off = std::move(why);
    }
  if (gone_since_ && now >= next_reminder_) {
    next_reminder_ = now + reminder_every;
    spdlog::warn("node {}: still no connection to the coordinator at {} ({:.0f} s){}; {}", name,
                 control.endpoint(), std::chrono::duration<double>(now - *gone_since_).count(),
                 refused_.empty() ? "" : "; last refusal: " + refused_,
                 elastic && elastic->fenced() ? "this node's ring is fenced and waits for a coordinator"
                 : cut_off_.stalled()         ? "this node's ring failed and waits for a coordinator"
                                              : "training goes on");
  }
  return asks;
}

void master_watch::reannounce(control_client& control, const comm::elastic_ring& elastic,
                              steady::time_point now) {
  next_announce_ = now + std::chrono::seconds(2);
  auto h = hello_;
  h.running = true;
  h.epoch = elastic.epoch();
  // Fenced (the old master died between its fence and the membership): a member count of 0 makes the new
  // master fence again instead of adopting an epoch these nodes are leaving.
  h.world_size = elastic.fenced() ? 0 : static_cast<uint32_t>(elastic.world_size());
  h.committed = version_ > 0 ? comm::reduce_key{version_, 0} : elastic.committed();
  for (const auto& m : told_) {
    if (m.version <= version_) continue;
    if (h.merging.size() < max_held_merges) h.merging.push_back(m);
    h.newest_told = std::max(h.newest_told, m.version);
  }
  control.reannounce(h);
}

void master_watch::report(control_client& control, comm::elastic_ring& elastic, const std::string& name,
                          steady::time_point now) {
  if (const auto ack = elastic.fence_report()) {
    control.fence_ack(*ack);
    spdlog::info(
        "node {}: ready for epoch {}: applied {}{}", name, ack->epoch, comm::label_text(ack->committed),
        ack->has_pending ? fmt::format("; all-reduce of {} in flight{}", comm::label_text(ack->pending),
                                       ack->have_result ? " (result held)" : "")
                         : std::string());
  }
  if (const auto f = elastic.take_failure()) {
    spdlog::warn("node {}: the ring of epoch {} failed{}: {}; asking the coordinator for a new epoch", name,
                 f->epoch, f->suspect.empty() ? "" : " (lost " + f->suspect + ")", f->reason);
    control.ring_failed({f->epoch, f->suspect, f->reason});
    cut_off_.ring_failed(f->began, now);
  }
}

void master_watch::on_event(const control_event& ev, comm::collective& ring, comm::elastic_ring* elastic,
                            const std::string& name, steady::time_point now) {
  using kind = control_event::kind;
  if (ev.what == kind::fence || ev.what == kind::membership || ev.what == kind::welcome ||
      ev.what == kind::notice) {
    known_again_ = known_again_ || (reannounce_ && ev.what != kind::notice);
    reannounce_ = false;  // the master knows this node
  }
  if (ev.what == kind::fence) cut_off_.fenced(ev.epoch, now);  // the coordinator deals with the failure
  if (ev.what == kind::membership) cut_off_.entered();
  if (ev.what == kind::welcome) {
    spdlog::info("node {}: the coordinator took this node on in epoch {}", name, ev.epoch);
  } else if (ev.what == kind::fence) {
    spdlog::info("node {}: the membership is changing to epoch {}: the all-reduce in flight is abandoned",
                 name, ev.epoch);
    if (elastic) elastic->fence(ev.epoch);
  } else if (ev.what == kind::membership) {
    enter(ev.membership, elastic, name);
  } else if (ev.what == kind::notice && ev.code == errc::evicted) {
    spdlog::error("node {}: the coordinator says: {}", name, ev.text);
    if (elastic)
      elastic->evict("the coordinator says: " + ev.text);
    else
      ring.cancel();
  } else if (ev.what == kind::nccl_id) {
    if (nccl_ids_) nccl_ids_->put(ev.epoch, ev.text);
  } else if (ev.what == kind::older_coordinator) {
    spdlog::warn(
        "node {}: ignoring a coordinator of term {}: this node follows the coordinator of term {} (two "
        "coordinators ran at once; the older steps down)",
        name, ev.round, ev.epoch);
  } else if (ev.what == kind::notice) {
    if (ev.code == errc::none)
      spdlog::info("node {}: the coordinator says: {}", name, ev.text);
    else
      spdlog::warn("node {}: the coordinator says: {}", name, ev.text);
  } else {
    on_connection(ev, name, now);
  }
}

void master_watch::enter(const membership_msg& m, comm::elastic_ring* elastic, const std::string& name) {
  const auto v = view_of(m);
  spdlog::info("node {}: epoch {}: rank {} of {} (ring {}); keeps the all-reduce of {}, redoes later ones",
               name, m.epoch, m.rank, m.peers.size(), fmt::format("{}", fmt::join(v.names, " -> ")),
               comm::label_text(m.commit));
  if (elastic) elastic->enter(v, m.commit);
  // The last epoch's ring threads and the state served to a joiner freed their buffers in arenas the next
  // threads may not reuse: without this a node's resident memory climbs over a run's first joins.
  if (const size_t freed = runtime::release_freed_memory(); freed >= (size_t{1} << 20))
    spdlog::info("node {}: epoch {}: freed buffers handed back; resident memory fell by {:.0f} MB", name,
                 m.epoch, static_cast<double>(freed) / 1e6);
}

/// The connection to the master dropped, was refused, or came back.
void master_watch::on_connection(const control_event& ev, const std::string& name, steady::time_point now) {
  using kind = control_event::kind;
  if (evicted_) return;  // its training ends: nothing goes on without the coordinator
  if (ev.what == kind::connection_lost) {
    gone_since_ = now;
    next_reminder_ = now + reminder_every;
    spdlog::warn(
        "node {}: lost the connection to the coordinator at {} (was it stopped?); training goes on without "
        "it",
        name, ev.text);
  } else if (ev.what == kind::refused) {
    // Said once per change of reason and then with the reminders: the socket retries every 5 s.
    if (!gone_since_) {
      gone_since_ = now;
      next_reminder_ = now + reminder_every;
    }
    if (ev.text != refused_) {
      refused_ = ev.text;
      spdlog::error(
          "node {}: {}; training goes on among this epoch's members, and membership changes wait until the "
          "coordinator admits this node again (it retries every 5 s)",
          name, ev.text);
    }
  } else if (ev.what == kind::connection_back && gone_since_) {
    spdlog::info(
        "node {}: connected to the coordinator at {} again after {:.0f} s; re-announcing this node (round, "
        "epoch) "
        "so that a restarted coordinator can take the running cluster over",
        name, ev.text, std::chrono::duration<double>(now - *gone_since_).count());
    gone_since_.reset();
    refused_.clear();
    reannounce_ = true;
    next_announce_ = now;
  }
}

void pin_follower::on_tick(const master_asks& asks, control_client& control,
                           const actors::node_controls& controls) {
  if (asks.pin_release) {
    if (hold_ || round_) {
      spdlog::info("node {}: the joiners were admitted (or gave up): going on", name_);
      controls.release();
    }
    hold_.reset();
    round_.reset();
    return;
  }
  if (asks.pin_query) {
    if (!hold_ && (hold_ = controls.hold()))
      spdlog::info(
          "node {}: a joiner's fetch was overtaken: this node holds after round {} until the coordinator "
          "says "
          "after which round the members hold",
          name_, *hold_);
    if (hold_) control.pin_ack(*hold_);
  }
  if (asks.pin_round && round_ != asks.pin_round) {
    round_ = asks.pin_round;
    spdlog::info("node {}: holding after round {} while joiners fetch its state", name_, *round_);
    controls.hold_until(*round_);
  }
}

void stop_follower::on_tick(const master_asks& asks, control_client& control,
                            const actors::node_controls& controls,
                            const std::function<void(std::string)>& record, steady::time_point now) {
  // A coordinator that took the cluster over mid-stop learns of the stop from the members' answers: the
  // round it holds after, or the round it was told it stops after.
  if (round_) {
    if (asks.known_again || asks.stop_query) control.stop_ack(*round_);
    return;
  }
  if (asks.known_again && hold_) {
    control.stop_ack(*hold_);
    held_since_ = now;  // a coordinator that took over (or came back) carries the stop on: the whole max_hold
  }
  if (asks.stop_query) {
    if (!hold_ && (hold_ = controls.hold())) {
      held_since_ = now;
      spdlog::info(
          "node {}: the cluster is stopping: this node holds after round {} until the coordinator says after "
          "which "
          "round every node stops",
          name_, *hold_);
    }
    if (hold_) control.stop_ack(*hold_);
  }
  if (asks.stop_round) return stop(*asks.stop_round, controls, record);
  if (hold_ && now - held_since_ > max_hold) {
    spdlog::warn("node {}: no stop round from the coordinator within {} s: stopping after round {}", name_,
                 max_hold.count(), *hold_);
    stop(*hold_, controls, record);
  }
}

void stop_follower::stop(uint64_t round, const actors::node_controls& controls,
                         const std::function<void(std::string)>& record) {
  round_ = round;
  spdlog::info(
      "node {}: the cluster stops after round {}: this node finishes it, saves its checkpoint and exits",
      name_, round);
  record(runtime::json_line("stop").add("round", round).str());
  controls.stop_after(round);
}

}  // namespace longwave::cluster
