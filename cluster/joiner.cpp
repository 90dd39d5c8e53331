// Joining a cluster (see joiner.hpp): the hello, the first answer, a place in the ring, the joiner.
#include "cluster/joiner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "actors/run_setup.hpp"
#include "cluster/cluster_file.hpp"
#include "cluster/node_watch.hpp"
#include "cluster/state_publisher.hpp"
#include "config/config_loader.hpp"
#include "models/data/data_fingerprint.hpp"

namespace longwave::cluster {

/// Node `index`'s hello, with the checkpoints it holds (the newest last) and where it serves its state.
hello_msg hello_of(const config::cluster_spec& spec, size_t index,
                   const std::vector<runtime::held_round>& held, const std::string& state_endpoint) {
  const auto& me = spec.nodes[index];
  hello_msg hello;
  hello.protocol_version = comm::protocol_version();
  hello.cluster_id = spec.cluster_id;
  hello.node_name = me.name;
  hello.n_workers = static_cast<uint32_t>(me.workers);
  hello.data_endpoint = me.endpoint;
  hello.worker_offset = config::worker_offset(spec, index);
  hello.resume_round = held.empty() ? 0 : held.back().round;
  for (const auto& h : held) {
    hello.checkpoint_rounds.push_back(h.round);
    hello.checkpoint_thetas.push_back(h.history);
  }
  const auto cfg = config::node_config(spec, index);
  hello.config_hash = cluster_fingerprint(spec, cfg);
  hello.training_settings = config::training_settings(cfg);
  hello.state_endpoint = state_endpoint;
  hello.data_fingerprint = models::data::data_fingerprint(actors::corpus_path(cfg));
  return hello;
}

void place_in_ring(actors::ring_place& place, const config::cluster_node& me, uint32_t rank, uint64_t epoch,
                   const std::vector<peer_entry>& peers, const char* what) {
  place.rank = static_cast<int>(rank);
  place.epoch = epoch;
  place.endpoints.clear();
  place.names.clear();
  place.public_keys.clear();
  for (const auto& p : peers) {
    if (const auto problem = config::endpoint_problem(p.endpoint); !problem.empty())
      throw lw_error(errc::malformed_frame, fmt::format("the coordinator's {} lists endpoint '{}' for {}: {}",
                                                        what, p.endpoint, p.name, problem));
    place.endpoints.push_back(p.endpoint);
    place.names.push_back(p.name);
    if (place.admitted) {
      if (p.public_key.empty())
        throw lw_error(errc::invalid_config,
                       fmt::format("the coordinator's {} gives no CURVE key for {}: it runs with [security] "
                                   "mode = \"none\" and this node with CURVE",
                                   what, p.name));
      place.public_keys.push_back(p.public_key);
    }
  }
  // The ring holds the members in file order; this node's data stays that of its file position.
  if (rank >= place.names.size() || place.names[rank] != me.name || place.endpoints[rank] != me.endpoint)
    throw lw_error(errc::invalid_config,
                   fmt::format("the coordinator placed this node at rank {} with another name or endpoint: "
                               "its cluster file differs from this one",
                               rank));
}

uint64_t join(control_client& control, const config::cluster_spec& spec, size_t index, const hello_msg& hello,
              actors::ring_place& place, std::optional<recover_msg>& recover) {
  const auto& me = spec.nodes[index];
  // A little longer than the coordinator's own deadline, so that a cluster called off for missing nodes
  // says so instead of timing out here.
  const double wait_s = spec.join_timeout_s + 5;
  spdlog::info("node {}: joining cluster '{}' at {} (waiting up to {:g} s)", me.name, spec.id,
               spec.coordinator, wait_s);
  const auto answer = control.join(hello, to_ms(wait_s));
  if (const auto* r = std::get_if<recover_msg>(&answer)) {
    recover = *r;
    return 0;
  }
  const auto& welcome = std::get<welcome_msg>(answer);
  admit_keys(place.admitted, welcome.keys);
  place_in_ring(place, me, welcome.rank, welcome.epoch, welcome.peers, "welcome");
  // Its state is that after round start_round, as a joiner's that fetched it: until its first all-reduce,
  // its heartbeats and fence answers say so (round 0 pinned joiners and turned back ready ones).
  place.committed = comm::reduce_key{welcome.start_round, 0};
  spdlog::info("node {}: joined as rank {} of {}{}", me.name, welcome.rank, welcome.world_size,
               welcome.start_round > 0 ? fmt::format("; resuming after round {}", welcome.start_round) : "");
  return welcome.start_round;
}

actors::joined_state joiner::operator()(const runtime::snapshot_shape& shape, actors::own_checkpoint own) {
  constexpr int max_attempts = 5;
  for (int attempt = 1;; ++attempt) {
    actors::joined_state got;
    // Its own checkpoint of the members' round serves when it holds their theta: one of another training
    // history (the same round reached apart from them) is fetched over, as is one whose theta the members'
    // coordinator does not know (it restarted since their last commit).
    const bool at_round = !versions_ && own.round > 0 && own.round == recover_.round && attempt == 1;
    const bool known = recover_.theta_crc != 0 && own.theta_crc != 0;
    if (at_round && (!same_theta_ || (known && own.theta_crc == recover_.theta_crc))) {
      got.round = own.round;
      spdlog::info(
          "node {}: the members are at round {}, as is this node's own newest checkpoint: starting "
          "from it instead of fetching the state",
          me_.name, own.round);
    } else {
      if (at_round && known)
        spdlog::warn(
            "node {}: its own checkpoint of round {} holds another theta than the members' (CRC {:08x}, "
            "theirs {:08x}): another training history; it fetches their state",
            me_.name, own.round, own.theta_crc, recover_.theta_crc);
      else if (at_round)
        spdlog::info(
            "node {}: the members are at round {}, as is this node's own newest checkpoint, but their theta "
            "after it is not known here: it fetches their state",
            me_.name, own.round);
      got = fetch(shape);
    }
    slow_link_fault();
    auto answer = ready(got);
    // The master's word that the members hold for this node, or its answer to a hello said before, crossed
    // its ready and names the round it holds: it says ready again (the master ignores a repeat it has).
    constexpr int max_crossed = 8;
    for (int crossed = 0; crossed < max_crossed; ++crossed) {
      const auto* r = std::get_if<recover_msg>(&answer);
      if (!r || r->round != got.round) break;
      answer = ready(got);
    }
    if (const auto* m = std::get_if<membership_msg>(&answer)) return admitted(*m, std::move(got));
    recover_ = std::get<recover_msg>(answer);
    // A note-less recover: the coordinator (restarted, or answering a repeated hello) names no reason.
    const auto why =
        recover_.note.empty()
            ? fmt::format("the coordinator asks it to fetch the state of round {}", recover_.round)
            : recover_.note;
    if (attempt >= max_attempts)
      throw lw_error(errc::peer_lost,
                     fmt::format("the members moved on {} times while this node fetched their state ({}); "
                                 "its link may be too slow for the round time",
                                 attempt, why));
    spdlog::warn("node {}: {} (attempt {} of {})", me_.name, why, attempt + 1, max_attempts);
  }
}

actors::joined_state joiner::admitted(const membership_msg& m, actors::joined_state got) {
  admit_keys(place_.admitted, m.keys);
  place_in_ring(place_, me_, m.rank, m.epoch, m.peers, "membership");
  place_.ring.names = place_.names;
  place_.committed = m.commit;
  place_.observe_round = versions_ ? 0 : got.round + 1;
  actors::recovery_info info;
  info.round = got.round;
  info.epoch = m.epoch;
  info.rank = m.rank;
  info.members = fmt::format("{}", fmt::join(place_.names, ","));
  info.source = got.fetched ? last_source_ : "own checkpoint";
  info.bytes = got.fetched ? last_fetch_bytes_ : 0;
  info.seconds = got.fetched ? last_fetch_seconds_ : 0;
  place_.recovery = info;
  if (versions_)
    spdlog::info(
        "node {}: admitted in epoch {} as rank {} of {} with the state of version {}: it trains from "
        "there",
        me_.name, m.epoch, m.rank, m.peers.size(), got.round);
  else
    spdlog::info(
        "node {}: admitted in epoch {} as rank {} of {} with the state of round {}; round {} it "
        "only observes (no inner steps, weight 0), then it trains",
        me_.name, m.epoch, m.rank, m.peers.size(), got.round, got.round + 1);
  return got;
}

std::variant<membership_msg, recover_msg> joiner::ready(const actors::joined_state& got) {
  for (int hellos = 0;; ++hellos) {
    try {
      return control_.join_ready({comm::reduce_key{got.round, 0}, got.round},
                                 to_ms(std::max(60.0, spec_.join_timeout_s)));
    } catch (const lw_error& e) {
      if (e.code() != errc::not_announced || hellos >= 3) throw;
      spdlog::warn("node {}: {}; saying hello again", me_.name, e.what());
    }
    const auto again = control_.join(hello_, to_ms(spec_.join_timeout_s + 5));
    const auto* r = std::get_if<recover_msg>(&again);
    if (!r)
      throw lw_error(
          errc::peer_lost,
          fmt::format("the restarted coordinator at {} welcomed this node as a cluster that is not "
                      "training yet; restart the node",
                      spec_.coordinator));
    recover_ = *r;
    if (recover_.round != got.round) return recover_;  // the members moved on while the master restarted
    spdlog::info(
        "node {}: the restarted coordinator knows this node again; the members are still at round {}",
        me_.name, got.round);
  }
}

void joiner::slow_link_fault() {
  if (const char* gate = std::getenv("LONGWAVE_FAULT_JOIN_GATE"); gate && *gate && !gate_passed_) {
    gate_passed_ = true;  // the first fetched state only
    spdlog::warn("node {}: LONGWAVE_FAULT_JOIN_GATE: waiting for {} before saying it is ready", me_.name,
                 gate);
    while (!std::filesystem::exists(gate)) {
      control_.heartbeat(0, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  const char* v = std::getenv("LONGWAVE_FAULT_SLOW_JOIN_MS");
  const long ms = v ? std::strtol(v, nullptr, 10) : 0;
  if (ms <= 0) return;
  spdlog::warn("node {}: LONGWAVE_FAULT_SLOW_JOIN_MS: waiting {} ms before saying it is ready", me_.name, ms);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    control_.heartbeat(0, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

namespace {

/// Thrown from a fetch's callbacks when the master names another state to fetch (the members hold for this
/// node at a round boundary): the fetch in progress is abandoned for it.
struct new_plan {};

}  // namespace

actors::joined_state joiner::fetch(const runtime::snapshot_shape& shape) {
  for (;;) {
    try {
      return fetch_planned(shape);
    } catch (const new_plan&) {
      // recover_ names the state and its sources now.
    }
  }
}

actors::joined_state joiner::fetch_planned(const runtime::snapshot_shape& shape) {
  sources src;
  for (const auto& p : recover_.sources) {
    src.endpoints.push_back(p.endpoint);
    src.names.push_back(p.name);
    src.keys.push_back(p.public_key);
  }
  if (src.endpoints.empty())
    throw lw_error(errc::peer_lost, "the coordinator named no member that serves the training state");
  // Sent back because the members moved on: the state of the round they hold, once they serve it. async: the
  // version they hold for this node, always.
  const uint64_t min_round = recover_.note.empty() && !versions_ ? 0 : recover_.round;
  spdlog::info("node {}: fetching the training state{} from {} member(s) ({})", me_.name,
               versions_       ? fmt::format(" of version {}", min_round)
               : min_round > 0 ? fmt::format(" of round {} or later", min_round)
                               : "",
               src.endpoints.size(), fmt::join(src.names, ", "));
  last_beat_ = std::chrono::steady_clock::now();
  fetch_options o;
  if (place_.ring.curve) {
    o.curve = place_.ring.curve->own;
    o.peer_keys = src.keys;
  }
  o.progress = [&](uint64_t done, uint64_t total) {
    spdlog::info("node {}: fetched {:.1f} of {:.1f} MB", me_.name, static_cast<double>(done) / 1e6,
                 static_cast<double>(total) / 1e6);
    beat();
  };
  o.tick = [this] { beat(); };  // heartbeats go on while a dead source stalls the fetch
  o.fragment = shared_part;
  o.min_round = min_round;
  o.own_contents = !same_theta_ && !versions_;  // eager: each member's theta is its own
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline =
      t0 + std::chrono::seconds(static_cast<int64_t>(std::max(120.0, spec_.join_timeout_s)));
  auto next_note = t0;
  fetched_parts got;
  for (;;) {
    const auto failure = fetch_once(src, o, got);
    if (failure.empty()) break;
    // Not served yet (a member serves a round once its outer step is done), or the members moved on during
    // the download (a server keeps its newest round only): fetch the newest again.
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) throw lw_error(errc::peer_lost, "no state to fetch from the members: " + failure);
    if (now >= next_note) {
      spdlog::info("node {}: no state fetched yet ({}); trying again", me_.name, failure);
      next_note = now + std::chrono::seconds(10);
    }
    beat();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return assemble(got, shape, src,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

std::string joiner::fetch_once(const sources& src, fetch_options& o, fetched_parts& got) {
  got = {};
  std::string failure;
  try {
    got.shared = fetch_state(src.endpoints, spec_.cluster_id, o);
    // This node's workers start from one member's worker state (its Adam moments and counters), asked of
    // the sources that served the shared part first: one dropped from it (dead, or stalled) comes last.
    auto own_opts = o;
    own_opts.want = comm::reduce_key{got.shared->key.round, own_part};
    std::vector<size_t> order(src.endpoints.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const auto& sent = got.shared->bytes_per_peer;
    std::stable_partition(order.begin(), order.end(),
                          [&](size_t i) { return i < sent.size() && sent[i] > 0; });
    for (const size_t i : order) {
      if (got.own) break;
      try {
        if (o.curve) own_opts.peer_keys = {src.keys[i]};
        got.own = fetch_state({src.endpoints[i]}, spec_.cluster_id, own_opts);
        got.donor = src.names[i];
      } catch (const lw_error& e) {
        if (e.code() == errc::cancelled || e.code() == errc::evicted) throw;
        failure += fmt::format("; {}: {}", src.names[i], e.what());
      }
    }
    if (got.own) return "";
    return fmt::format("no member served its worker state of round {}{}", got.shared->key.round, failure);
  } catch (const lw_error& e) {
    // Every source dead, gone or stalled: try again (the master may name others meanwhile).
    if (e.code() != errc::peer_lost && e.code() != errc::deadline_missed) throw;
    return e.what();
  }
}

void joiner::beat() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_beat_ < std::chrono::seconds(1)) return;
  last_beat_ = now;
  control_.heartbeat(0, 0);
  for (const auto& ev : control_.poll()) {
    if (ev.what == control_event::kind::notice && ev.code == errc::cancelled)
      throw lw_error(errc::cancelled, ev.text);  // the cluster stops (longwave stop)
    // The cluster was called off (or this node removed): fetching on would be for nothing.
    if (ev.what == control_event::kind::notice && ev.code == errc::evicted)
      throw lw_error(errc::evicted, ev.text);
    // The members hold for this node: their state of that round, from the members the master names now.
    if (ev.what == control_event::kind::recover && ev.recover.round != recover_.round) {
      recover_ = ev.recover;
      spdlog::info("node {}: {}", me_.name, recover_.note);
      throw new_plan{};
    }
  }
}

actors::joined_state joiner::assemble(fetched_parts& got, const runtime::snapshot_shape& shape,
                                      const sources& src, double secs) {
  auto whole = runtime::checkpoint_from_bytes(got.shared->bytes);
  auto part = runtime::checkpoint_from_bytes(got.own->bytes);
  whole.meta = std::move(part.meta);
  whole.step = part.step;  // the donor's (async: the shared part names a version and step 0)
  for (auto& b : part.blobs) whole.blobs.push_back(std::move(b));
  auto shape1 = shape;
  shape1.n_replicas = 1;  // a served state carries one replica; joined_start copies it for each worker
  actors::joined_state out;
  out.fetched = runtime::from_checkpoint(std::move(whole), shape1);
  out.round = out.fetched->round;
  const auto bytes = got.shared->bytes.size() + got.own->bytes.size();
  std::string per_peer;
  for (size_t i = 0; i < got.shared->bytes_per_peer.size() && i < src.names.size(); ++i)
    per_peer += fmt::format("{}{} {:.1f} MB", per_peer.empty() ? "" : ", ", src.names[i],
                            static_cast<double>(got.shared->bytes_per_peer[i]) / 1e6);
  spdlog::info(
      "node {}: fetched the state of {} {}: {:.1f} MB in {:.2f} s ({:.1f} MB/s; shared part {}; worker "
      "state "
      "from {})",
      me_.name, versions_ ? "version" : "round", out.round, static_cast<double>(bytes) / 1e6, secs,
      static_cast<double>(bytes) / 1e6 / std::max(secs, 1e-9), per_peer, got.donor);
  for (const auto& d : got.shared->dropped) spdlog::warn("node {}: state source dropped: {}", me_.name, d);
  last_fetch_bytes_ = bytes;
  last_fetch_seconds_ = secs;
  last_source_ = fmt::format("{}", fmt::join(src.names, ", "));
  return out;
}

}  // namespace longwave::cluster
