// Coordinator and node roles of a cluster file.
#include "actors/cluster.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "comm/elastic_ring.hpp"
#include "comm/rendezvous.hpp"
#include "comm/state_transfer.hpp"
#include "config/config_loader.hpp"
#include "runtime/checkpoint/checkpoint_bytes.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/log/log.hpp"
#include "runtime/memory/allocator.hpp"
#include "runtime/metrics/metrics_registry.hpp"
#include "runtime/metrics/metrics_server.hpp"

namespace longwave::actors {

namespace {

std::atomic<int> g_coordinator_signals{0};

void on_coordinator_signal(int) {
  g_coordinator_signals.fetch_add(1);
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

/// The epoch view of a membership message.
comm::epoch_view view_of(const comm::membership_msg& m) {
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

/// CURVE: admits exactly the node keys the coordinator listed (a welcome's or a membership's, each the whole
/// list) on this node's state socket: a key it no longer lists (revoked) is no longer admitted.
void admit(const std::shared_ptr<comm::key_ring>& ring, const std::vector<comm::peer_entry>& keys) {
  if (!ring) return;
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& k : keys)
    if (!k.public_key.empty()) entries.emplace_back(k.name, k.public_key);
  ring->assign(entries);
}

/// What the coordinator asked of a training node since the last tick.
struct coordinator_asks {
  bool leave = false;                  ///< leave at the next round boundary (longwave node --leave)
  bool stop_query = false;             ///< the cluster stops: where can this node stop?
  std::optional<uint64_t> stop_round;  ///< the cluster stops after this round
};

/// A node's view of its coordinator while it trains: membership changes reach the ring (fence, next epoch,
/// removal), the ring's answers and failures reach the coordinator, and a coordinator that went away is said
/// once, then reminded of every minute.
class coordinator_watch {
 public:
  /// hello: this node's hello, re-sent (running) to a coordinator that comes back.
  /// admitted: CURVE's admitted node keys, which each membership extends (nullptr without CURVE).
  coordinator_watch(comm::hello_msg hello, std::shared_ptr<comm::key_ring> admitted)
      : hello_(std::move(hello)), admitted_(std::move(admitted)) {}

  /// What the coordinator asked of this node (leave, a cluster stop).
  coordinator_asks on_tick(comm::control_client& control, comm::collective& ring, const std::string& name,
                           std::chrono::steady_clock::time_point now,
                           const std::function<void(std::string)>& record) {
    auto* elastic = dynamic_cast<comm::elastic_ring*>(&ring);
    coordinator_asks asks;
    for (const auto& ev : control.poll()) {
      asks.leave = asks.leave || ev.what == comm::control_event::kind::leave;
      if (ev.what == comm::control_event::kind::stop) {
        if (ev.round == 0)
          asks.stop_query = true;
        else
          asks.stop_round = ev.round;
      }
      // The new membership's keys first, then its ring.
      if (ev.what == comm::control_event::kind::membership) admit(admitted_, ev.membership.keys);
      on_event(ev, ring, elastic, name, now);
      if (ev.what == comm::control_event::kind::membership) {
        // metrics.jsonl: membership over time, for `longwave report`.
        std::string members;
        for (const auto& p : ev.membership.peers) members += (members.empty() ? "" : ",") + p.name;
        record(runtime::json_line("membership")
                   .add("epoch", ev.epoch)
                   .add("rank", static_cast<uint64_t>(ev.membership.rank))
                   .add("members", members)
                   .add("kept_round", ev.membership.commit.round)
                   .add("kept_fragment", static_cast<uint64_t>(ev.membership.commit.fragment))
                   .str());
      }
    }
    if (elastic && reannounce_ && now >= next_announce_) {
      // Until the coordinator answers: a restarted one takes the running cluster over from these.
      next_announce_ = now + std::chrono::seconds(2);
      auto h = hello_;
      h.running = true;
      h.epoch = elastic->epoch();
      // Fenced (the old coordinator died between its fence and the membership): a member count of 0 makes
      // the new coordinator fence again instead of adopting an epoch these nodes are leaving.
      h.world_size = elastic->fenced() ? 0 : static_cast<uint32_t>(elastic->world_size());
      h.committed = elastic->committed();
      control.reannounce(h);
    }
    if (elastic) {
      if (const auto ack = elastic->fence_report()) {
        control.fence_ack(*ack);
        spdlog::info("node {}: ready for epoch {}: applied round {} fragment {}{}", name, ack->epoch,
                     ack->committed.round, ack->committed.fragment,
                     ack->has_pending
                         ? fmt::format("; all-reduce of round {} fragment {} in flight{}", ack->pending.round,
                                       ack->pending.fragment, ack->have_result ? " (result held)" : "")
                         : std::string());
      }
      if (const auto f = elastic->take_failure()) {
        spdlog::warn("node {}: the ring of epoch {} failed{}: {}; asking the coordinator for a new epoch",
                     name, f->epoch, f->suspect.empty() ? "" : " (lost " + f->suspect + ")", f->reason);
        control.ring_failed({f->epoch, f->suspect, f->reason});
      }
    }
    if (gone_since_ && now >= next_reminder_) {
      next_reminder_ = now + reminder_every;
      spdlog::warn("node {}: still no connection to the coordinator at {} ({:.0f} s){}; training goes on",
                   name, control.endpoint(), std::chrono::duration<double>(now - *gone_since_).count(),
                   refused_.empty() ? "" : "; last refusal: " + refused_);
    }
    return asks;
  }

 private:
  void on_event(const comm::control_event& ev, comm::collective& ring, comm::elastic_ring* elastic,
                const std::string& name, std::chrono::steady_clock::time_point now) {
    using kind = comm::control_event::kind;
    if (ev.what == kind::fence || ev.what == kind::membership || ev.what == kind::welcome ||
        ev.what == kind::notice)
      reannounce_ = false;  // the coordinator knows this node
    if (ev.what == kind::welcome) {
      spdlog::info("node {}: the coordinator took this node on in epoch {}", name, ev.epoch);
    } else if (ev.what == kind::fence) {
      spdlog::info("node {}: the membership is changing to epoch {}: the all-reduce in flight is abandoned",
                   name, ev.epoch);
      if (elastic) elastic->fence(ev.epoch);
    } else if (ev.what == kind::membership) {
      const auto& m = ev.membership;
      const auto v = view_of(m);
      const std::string ring_text = fmt::format("{}", fmt::join(v.names, " -> "));
      spdlog::info(
          "node {}: epoch {}: rank {} of {} (ring {}); keeps the all-reduce of round {} fragment {}, "
          "redoes later ones",
          name, m.epoch, m.rank, m.peers.size(), ring_text, m.commit.round, m.commit.fragment);
      if (elastic) elastic->enter(v, m.commit);
      // The last epoch's ring threads and the state served to a joiner freed their buffers in arenas the
      // next threads may not reuse: without this a node's resident memory climbs over a run's first joins.
      if (const size_t freed = runtime::release_freed_memory(); freed >= (size_t{1} << 20))
        spdlog::info("node {}: epoch {}: freed buffers handed back; resident memory fell by {:.0f} MB", name,
                     m.epoch, static_cast<double>(freed) / 1e6);
    } else if (ev.what == kind::notice && ev.code == errc::evicted) {
      spdlog::error("node {}: the coordinator says: {}", name, ev.text);
      if (elastic)
        elastic->evict("the coordinator says: " + ev.text);
      else
        ring.cancel();
    } else if (ev.what == kind::notice && ev.code == errc::none) {
      spdlog::info("node {}: the coordinator says: {}", name, ev.text);
    } else if (ev.what == kind::notice) {
      spdlog::warn("node {}: the coordinator says: {}", name, ev.text);
    } else if (ev.what == kind::connection_lost) {
      gone_since_ = now;
      next_reminder_ = now + reminder_every;
      spdlog::warn(
          "node {}: lost the connection to the coordinator at {} (was it stopped?); training goes on "
          "without it",
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
            "node {}: {}; training goes on among this epoch's members, and membership changes wait "
            "until the coordinator admits this node again (it retries every 5 s)",
            name, ev.text);
      }
    } else if (ev.what == kind::connection_back && gone_since_) {
      spdlog::info(
          "node {}: connected to the coordinator at {} again after {:.0f} s; re-announcing this node (round, "
          "epoch) so that a restarted coordinator can take the running cluster over",
          name, ev.text, std::chrono::duration<double>(now - *gone_since_).count());
      gone_since_.reset();
      refused_.clear();
      reannounce_ = true;
      next_announce_ = now;
    }
  }

  static constexpr auto reminder_every = std::chrono::seconds(60);
  comm::hello_msg hello_;
  std::shared_ptr<comm::key_ring> admitted_;
  std::optional<std::chrono::steady_clock::time_point> gone_since_;
  std::string refused_;  // why the coordinator refuses this node's handshake now ("" while it does not)
  std::chrono::steady_clock::time_point next_reminder_;
  bool reannounce_ = false;
  std::chrono::steady_clock::time_point next_announce_;
};

/// theta_global's CRC after each round, handed from the training coordinator's thread to the main loop,
/// which sends them to the coordinator (it compares the members').
class committed_rounds {
 public:
  void push(uint64_t round, uint32_t crc) {
    std::lock_guard<std::mutex> lk(mu_);
    if (items_.size() < max_items) items_.emplace_back(round, crc);
  }
  std::vector<std::pair<uint64_t, uint32_t>> take() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(items_, {});
  }

 private:
  static constexpr size_t max_items = 1024;  // a main loop that stalls loses later reports, not memory
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint32_t>> items_;
};

/// A cluster stop (longwave stop) as one node follows it: asked where it can stop, it holds at the boundary
/// after its current round and says which; told the round after which every node stops, it trains to it,
/// saves its checkpoint and exits. Without that round within max_hold (the coordinator went away) it stops
/// where it holds.
class stop_follower {
 public:
  explicit stop_follower(std::string name) : name_(std::move(name)) {}

  void on_tick(const coordinator_asks& asks, comm::control_client& control, const node_controls& controls,
               const std::function<void(std::string)>& record, std::chrono::steady_clock::time_point now) {
    if (round_) return;
    if (asks.stop_query) {
      if (!hold_ && (hold_ = controls.hold())) {
        held_since_ = now;
        spdlog::info(
            "node {}: the cluster is stopping: this node holds after round {} until the coordinator says "
            "after which round every node stops",
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

  /// The round after which this node stops (nullopt: it is not stopping).
  std::optional<uint64_t> round() const { return round_; }

 private:
  void stop(uint64_t round, const node_controls& controls, const std::function<void(std::string)>& record) {
    round_ = round;
    spdlog::info(
        "node {}: the cluster stops after round {}: this node finishes it, saves its checkpoint and "
        "exits",
        name_, round);
    record(runtime::json_line("stop").add("round", round).str());
    controls.stop_after(round);
  }

  static constexpr std::chrono::seconds max_hold{60};
  std::string name_;
  std::optional<uint64_t> hold_, round_;
  std::chrono::steady_clock::time_point held_since_;
};

/// The training fingerprint a node's hello carries and the coordinator checks: the training settings and how
/// the data is split (which windows each global rank reads).
uint64_t cluster_fingerprint(const config::cluster_spec& spec, const config::train_config& cfg) {
  return config::training_fingerprint(cfg) ^
         (static_cast<uint64_t>(config::data_partitions(spec)) * 0x9E3779B97F4A7C15ull);
}

/// Node `index`'s hello, with resume_round its newest checkpoint's round and where it serves its state.
comm::hello_msg hello_of(const config::cluster_spec& spec, size_t index, uint64_t resume_round,
                         const std::string& state_endpoint) {
  const auto& me = spec.nodes[index];
  comm::hello_msg hello;
  hello.protocol_version = comm::protocol_version();
  hello.cluster_id = spec.cluster_id;
  hello.node_name = me.name;
  hello.n_workers = static_cast<uint32_t>(me.workers);
  hello.data_endpoint = me.endpoint;
  hello.resume_round = resume_round;
  hello.config_hash = cluster_fingerprint(spec, config::node_config(spec, index));
  hello.state_endpoint = state_endpoint;
  return hello;
}

/// Sets role's rank, epoch and every rank's name and endpoint; throws lw_error when an endpoint is malformed
/// or this node's place does not carry its own name and endpoint (another cluster file).
void place_in_ring(cluster_role& role, const config::cluster_node& me, uint32_t rank, uint64_t epoch,
                   const std::vector<comm::peer_entry>& peers, const char* what) {
  role.rank = static_cast<int>(rank);
  role.epoch = epoch;
  role.endpoints.clear();
  role.names.clear();
  role.public_keys.clear();
  for (const auto& p : peers) {
    if (const auto problem = config::endpoint_problem(p.endpoint); !problem.empty())
      throw lw_error(errc::malformed_frame, fmt::format("the coordinator's {} lists endpoint '{}' for {}: {}",
                                                        what, p.endpoint, p.name, problem));
    role.endpoints.push_back(p.endpoint);
    role.names.push_back(p.name);
    if (role.admitted) {
      if (p.public_key.empty())
        throw lw_error(errc::invalid_config,
                       fmt::format("the coordinator's {} gives no CURVE key for {}: it runs with [security] "
                                   "mode = \"none\" and this node with CURVE",
                                   what, p.name));
      role.public_keys.push_back(p.public_key);
    }
  }
  // The ring holds the members in file order; this node's data stays that of its file position.
  if (rank >= role.names.size() || role.names[rank] != me.name || role.endpoints[rank] != me.endpoint)
    throw lw_error(errc::invalid_config,
                   fmt::format("the coordinator placed this node at rank {} with another name or endpoint: "
                               "its cluster file differs from this one",
                               rank));
}

/// The two parts of a served state: (round, shared_part) and (round, own_part).
constexpr uint32_t shared_part = 0, own_part = 1;

/// Serves this node's round-boundary states to joiners: the training thread hands over a checkpoint (no
/// copy), a thread of its own turns the newest into bytes and publishes it, off the training path.
class state_publisher {
 public:
  /// Listens on the host of this node's ring endpoint, on a port the system picks (CURVE: admitting the
  /// cluster's node keys).
  state_publisher(const std::string& ring_endpoint, uint64_t cluster_id,
                  std::optional<comm::curve_server_keys> curve)
      : server_(ring_endpoint.substr(0, ring_endpoint.rfind(':')) + ":*", cluster_id, std::move(curve)),
        thread_([this] { run(); }) {}
  ~state_publisher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::string endpoint() const { return server_.endpoint(); }
  /// Newest wins: a state still waiting when the next one comes is dropped.
  void publish(runtime::checkpoint c) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      slot_ = std::move(c);
    }
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      runtime::checkpoint c;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || slot_; });
        if (stop_) return;
        c = std::move(*slot_);
        slot_.reset();
      }
      // Two states per round: what every member holds alike (theta, momentum, a pending average), which a
      // joiner fetches from all members at once, and this node's worker state (with the meta, which names
      // this node's files), which it fetches from one.
      runtime::checkpoint shared, own;
      shared.round = own.round = c.round;
      shared.step = own.step = c.step;
      own.meta = std::move(c.meta);
      for (auto& b : c.blobs) (b.name.rfind("replica", 0) == 0 ? own : shared).blobs.push_back(std::move(b));
      auto publish = [&](uint32_t part, const runtime::checkpoint& x) {
        server_.publish(comm::reduce_key{c.round, part}, c.round,
                        std::make_shared<const std::vector<std::byte>>(runtime::checkpoint_to_bytes(x)));
      };
      publish(own_part, own);
      publish(shared_part, shared);
    }
  }

  comm::state_server server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<runtime::checkpoint> slot_;
  bool stop_ = false;
  std::thread thread_;
};

/// Joins the cluster as node `index`, with resume_round its newest checkpoint's round. A cluster that is
/// starting answers with a welcome: sets role's place in the ring and returns the round the cluster resumes
/// after. A cluster already training answers with where to fetch its state: returned in *recover (the node
/// then joins through cluster_role::join). Throws lw_error when the answer is malformed or does not match
/// this cluster file, or the node is turned away.
uint64_t join(comm::control_client& control, const config::cluster_spec& spec, size_t index,
              uint64_t resume_round, const std::string& state_endpoint, cluster_role& role,
              std::optional<comm::recover_msg>& recover) {
  const auto& me = spec.nodes[index];
  const auto hello = hello_of(spec, index, resume_round, state_endpoint);
  // A little longer than the coordinator's own deadline, so that a cluster called off for missing nodes
  // says so instead of timing out here.
  const double wait_s = spec.join_timeout_s + 5;
  spdlog::info("node {}: joining cluster '{}' at {} (waiting up to {:g} s)", me.name, spec.id,
               spec.coordinator, wait_s);
  const auto answer = control.join(hello, to_ms(wait_s));
  if (const auto* r = std::get_if<comm::recover_msg>(&answer)) {
    recover = *r;
    return 0;
  }
  const auto& welcome = std::get<comm::welcome_msg>(answer);
  admit(role.admitted, welcome.keys);
  place_in_ring(role, me, welcome.rank, welcome.epoch, welcome.peers, "welcome");
  spdlog::info("node {}: joined as rank {} of {}{}", me.name, welcome.rank, welcome.world_size,
               welcome.start_round > 0 ? fmt::format("; resuming after round {}", welcome.start_round) : "");
  return welcome.start_round;
}

/// A node joining a running cluster (cluster_role::join): fetches the members' state from the sources the
/// coordinator named (or takes its own checkpoint when that is at the members' round), says it is ready,
/// and is admitted at a fence or sent to fetch again (the members moved on meanwhile).
class joiner {
 public:
  joiner(comm::control_client& control, const config::cluster_spec& spec, size_t index,
         comm::recover_msg first, cluster_role& role)
      : control_(control), spec_(spec), me_(spec.nodes[index]), recover_(std::move(first)), role_(role) {}

  joined_state operator()(const runtime::snapshot_shape& shape, uint64_t own_round) {
    constexpr int max_attempts = 5;
    for (int attempt = 1;; ++attempt) {
      joined_state got;
      if (own_round > 0 && own_round == recover_.round && attempt == 1) {
        got.round = own_round;
        spdlog::info(
            "node {}: the members are at round {}, as is this node's own newest checkpoint: starting "
            "from it instead of fetching the state",
            me_.name, own_round);
      } else {
        got = fetch(shape);
      }
      slow_link_fault();
      const auto answer = control_.join_ready({comm::reduce_key{got.round, 0}, got.round},
                                              to_ms(std::max(60.0, spec_.join_timeout_s)));
      if (const auto* m = std::get_if<comm::membership_msg>(&answer)) {
        admit(role_.admitted, m->keys);
        place_in_ring(role_, me_, m->rank, m->epoch, m->peers, "membership");
        role_.ring.names = role_.names;
        role_.committed = m->commit;
        role_.observe_round = got.round + 1;
        recovery_info info;
        info.round = got.round;
        info.epoch = m->epoch;
        info.rank = m->rank;
        info.members = fmt::format("{}", fmt::join(role_.names, ","));
        info.source = got.fetched ? last_source_ : "own checkpoint";
        info.bytes = got.fetched ? last_fetch_bytes_ : 0;
        info.seconds = got.fetched ? last_fetch_seconds_ : 0;
        role_.recovery = info;
        spdlog::info(
            "node {}: admitted in epoch {} as rank {} of {} with the state of round {}; round {} it "
            "only observes (no inner steps, weight 0), then it trains",
            me_.name, m->epoch, m->rank, m->peers.size(), got.round, got.round + 1);
        return got;
      }
      recover_ = std::get<comm::recover_msg>(answer);
      if (attempt >= max_attempts)
        throw lw_error(errc::peer_lost,
                       fmt::format("the members moved on {} times while this node fetched their state ({}); "
                                   "its link may be too slow for the round time",
                                   attempt, recover_.note));
      spdlog::warn("node {}: {} (attempt {} of {})", me_.name, recover_.note, attempt + 1, max_attempts);
    }
  }

 private:
  /// Tests: LONGWAVE_FAULT_SLOW_JOIN_MS=N holds each fetched state N ms before saying it is ready, as a link
  /// slower than the round time would.
  void slow_link_fault() {
    const char* v = std::getenv("LONGWAVE_FAULT_SLOW_JOIN_MS");
    const long ms = v ? std::strtol(v, nullptr, 10) : 0;
    if (ms <= 0) return;
    spdlog::warn("node {}: LONGWAVE_FAULT_SLOW_JOIN_MS: waiting {} ms before saying it is ready", me_.name,
                 ms);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      control_.heartbeat(0, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }

  joined_state fetch(const runtime::snapshot_shape& shape) {
    std::vector<std::string> sources, names, keys;
    for (const auto& p : recover_.sources) {
      sources.push_back(p.endpoint);
      names.push_back(p.name);
      keys.push_back(p.public_key);
    }
    if (sources.empty())
      throw lw_error(errc::peer_lost, "the coordinator named no member that serves the training state");
    // Sent back because the members moved on: the state of the round they hold, once they serve it.
    const uint64_t min_round = recover_.note.empty() ? 0 : recover_.round;
    spdlog::info("node {}: fetching the training state{} from {} member(s) ({})", me_.name,
                 min_round > 0 ? fmt::format(" of round {} or later", min_round) : "", sources.size(),
                 fmt::join(names, ", "));
    auto last_beat = std::chrono::steady_clock::now();
    auto beat = [&] {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_beat < std::chrono::seconds(1)) return;
      last_beat = now;
      control_.heartbeat(0, 0);  // the coordinator keeps a joiner that is heard from
      for (const auto& ev : control_.poll())
        if (ev.what == comm::control_event::kind::notice && ev.code == errc::cancelled)
          throw lw_error(errc::cancelled, ev.text);  // the cluster stops (longwave stop)
    };
    comm::fetch_options o;
    if (role_.ring.curve) {
      o.curve = role_.ring.curve->own;
      o.peer_keys = keys;
    }
    o.progress = [&](uint64_t done, uint64_t total) {
      spdlog::info("node {}: fetched {:.1f} of {:.1f} MB", me_.name, static_cast<double>(done) / 1e6,
                   static_cast<double>(total) / 1e6);
      beat();
    };
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline =
        t0 + std::chrono::seconds(static_cast<int64_t>(std::max(120.0, spec_.join_timeout_s)));
    auto next_note = t0;
    std::optional<comm::fetched_state> shared, own;
    std::string donor;
    for (;;) {
      std::string failure;
      try {
        o.fragment = shared_part;
        o.min_round = min_round;
        shared = comm::fetch_state(sources, spec_.cluster_id, o);
        // This node's workers start from one member's worker state (its Adam moments and counters).
        auto own_opts = o;
        own_opts.want = comm::reduce_key{shared->key.round, own_part};
        for (size_t i = 0; i < sources.size() && !own; ++i) {
          try {
            if (o.curve) own_opts.peer_keys = {keys[i]};
            own = comm::fetch_state({sources[i]}, spec_.cluster_id, own_opts);
            donor = names[i];
          } catch (const lw_error& e) {
            if (e.code() == errc::cancelled) throw;
            failure += fmt::format("; {}: {}", names[i], e.what());
          }
        }
        if (own) break;
        failure = fmt::format("no member served its worker state of round {}{}", shared->key.round, failure);
      } catch (const lw_error& e) {
        if (e.code() != errc::peer_lost) throw;
        failure = e.what();
      }
      // Not served yet (a member serves a round once its outer step is done), or the members moved on
      // during the download (a server keeps its newest round only): fetch the newest again.
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) throw lw_error(errc::peer_lost, "no state to fetch from the members: " + failure);
      if (now >= next_note) {
        spdlog::info("node {}: no state fetched yet ({}); trying again", me_.name, failure);
        next_note = now + std::chrono::seconds(10);
      }
      shared.reset();
      beat();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    auto whole = runtime::checkpoint_from_bytes(shared->bytes);
    auto part = runtime::checkpoint_from_bytes(own->bytes);
    whole.meta = std::move(part.meta);
    for (auto& b : part.blobs) whole.blobs.push_back(std::move(b));
    auto shape1 = shape;
    shape1.n_replicas = 1;  // a served state carries one replica; joined_start copies it for each worker
    joined_state got;
    got.fetched = runtime::from_checkpoint(std::move(whole), shape1);
    got.round = got.fetched->round;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto bytes = shared->bytes.size() + own->bytes.size();
    std::string per_peer;
    for (size_t i = 0; i < shared->bytes_per_peer.size() && i < names.size(); ++i)
      per_peer += fmt::format("{}{} {:.1f} MB", per_peer.empty() ? "" : ", ", names[i],
                              static_cast<double>(shared->bytes_per_peer[i]) / 1e6);
    spdlog::info(
        "node {}: fetched the state of round {}: {:.1f} MB in {:.2f} s ({:.1f} MB/s; shared part "
        "{}; worker state from {})",
        me_.name, got.round, static_cast<double>(bytes) / 1e6, secs,
        static_cast<double>(bytes) / 1e6 / std::max(secs, 1e-9), per_peer, donor);
    for (const auto& d : shared->dropped) spdlog::warn("node {}: state source dropped: {}", me_.name, d);
    last_fetch_bytes_ = bytes;
    last_fetch_seconds_ = secs;
    last_source_ = fmt::format("{}", fmt::join(names, ", "));
    return got;
  }

  comm::control_client& control_;
  const config::cluster_spec& spec_;
  const config::cluster_node& me_;
  comm::recover_msg recover_;
  cluster_role& role_;
  uint64_t last_fetch_bytes_ = 0;
  double last_fetch_seconds_ = 0;
  std::string last_source_;
};

/// [security] mode = "none": said once at the start of each role.
void warn_if_unsecured(const config::cluster_spec& spec, const std::string& role) {
  if (spec.security.mode == config::security_mode::none)
    spdlog::warn(
        "{}: [security] mode = \"none\": this cluster's links are neither authenticated nor encrypted; "
        "anyone who reaches its ports can join and send frames (make keys with `longwave keys new`)",
        role);
}

/// CURVE: node `name`'s keys (nullopt without CURVE). Throws lw_error (invalid_config) naming a missing or
/// bad key file.
std::optional<comm::cluster_keys> node_keys(const config::cluster_spec& spec, const std::string& name) {
  if (spec.security.mode != config::security_mode::curve) return std::nullopt;
  return comm::load_node_keys(spec.security.keys, name);
}

/// CURVE: what the node's control connection needs: its keys and the coordinator's public key.
std::optional<comm::curve_peer> control_curve(const std::optional<comm::cluster_keys>& keys) {
  if (!keys) return std::nullopt;
  return comm::curve_peer{keys->own, keys->coordinator_public};
}

/// `longwave node CLUSTER --node NAME --leave`: asks the coordinator to make NAME leave at its next round
/// boundary. 0 when it will, 2 when it cannot (not training, unknown), 1 when the coordinator cannot be
/// reached.
int request_leave(const config::cluster_spec& spec, const std::string& name) {
  try {
    comm::control_client control(spec.coordinators, spec.cluster_id, control_curve(node_keys(spec, name)));
    const auto [code, text] = control.request_leave(name, std::chrono::seconds(10));
    if (code == errc::none) {
      spdlog::info("the coordinator says: {}", text);
      return 0;
    }
    spdlog::error("the coordinator says: {}", text);
    return 2;
  } catch (const lw_error& e) {
    spdlog::error("{}", e.what());
    return e.code() == errc::invalid_config ? 2 : 1;
  }
}

}  // namespace

int request_cluster_stop(const config::cluster_spec& spec) {
  try {
    std::optional<comm::curve_peer> curve;
    if (spec.security.mode == config::security_mode::curve) {
      const auto keys = comm::load_coordinator_keys(spec.security.keys, {});
      curve = comm::curve_peer{keys.own, keys.coordinator_public};
    }
    comm::control_client control(spec.coordinators, spec.cluster_id, curve);
    const auto [code, text] = control.request_stop(std::chrono::seconds(10));
    if (code == errc::none) {
      spdlog::info("the coordinator says: {}", text);
      return 0;
    }
    spdlog::error("the coordinator says: {}", text);
    return code == errc::invalid_config ? 2 : 1;
  } catch (const lw_error& e) {
    spdlog::error("stop: {}", e.what());
    return e.code() == errc::invalid_config ? 2 : 1;
  }
}

int run_coordinator_role(const config::cluster_spec& spec, const std::string& bind) {
  comm::coordinator_options o;
  o.bind_endpoint = bind.empty() ? spec.coordinator : bind;
  if (std::find(spec.coordinators.begin(), spec.coordinators.end(), o.bind_endpoint) ==
      spec.coordinators.end()) {
    spdlog::error(
        "coordinator: --bind {} is not one of [cluster] coordinator's addresses ({}): the nodes would "
        "not find it",
        o.bind_endpoint, fmt::join(spec.coordinators, ", "));
    return 2;
  }
  o.cluster_id = spec.cluster_id;
  o.config_hash = cluster_fingerprint(spec, spec.train);
  o.open = spec.open;
  o.open_workers = static_cast<uint32_t>(spec.open_workers);
  for (const auto& n : spec.nodes)
    o.members.push_back({n.name, n.endpoint, static_cast<uint32_t>(n.workers)});
  o.join_timeout = to_ms(spec.join_timeout_s);
  o.heartbeat_timeout = to_ms(spec.heartbeat_timeout_s);
  o.min_nodes = static_cast<size_t>(spec.min_nodes);
  o.quorum_timeout = to_ms(spec.quorum_timeout_s);
  o.info = [](const std::string& s) { spdlog::info("{}", s); };
  o.warn = [](const std::string& s) { spdlog::warn("{}", s); };
  warn_if_unsecured(spec, "coordinator");
  if (spec.security.mode == config::security_mode::curve) {
    try {
      auto keys = comm::load_coordinator_keys(spec.security.keys, spec.security.revoked);
      o.curve = keys.own;
      o.node_keys = keys.nodes;
      // Keys made after the start (a new node of an open cluster, a listed node keyed late) are read when
      // they first knock.
      o.refresh_keys =
          comm::node_key_refresh(spec.security.keys, keys.nodes, [dir = spec.security.keys](size_t n) {
            spdlog::info("coordinator: admitted {} node key(s) added to {}/nodes", n, dir);
          });
      spdlog::info("coordinator: CURVE with keys from {}: {} node key(s) admitted{}", spec.security.keys,
                   keys.nodes->entries().size(),
                   spec.security.revoked.empty() ? std::string()
                                                 : fmt::format(", {} revoked", spec.security.revoked.size()));
    } catch (const lw_error& e) {
      spdlog::error("coordinator: {}", e.what());
      return 2;
    }
  }
  g_coordinator_signals = 0;
  std::signal(SIGINT, on_coordinator_signal);
  std::signal(SIGTERM, on_coordinator_signal);
  o.stop = [] { return g_coordinator_signals.load() > 0; };
  int code = 1;
  try {
    // The coordinator's own /metrics: membership, heartbeat ages, rejected control frames, errors.
    std::unique_ptr<runtime::metrics_registry> metrics;
    std::unique_ptr<runtime::metrics_server> server;
    if (spec.train.metrics.enabled) {
      std::vector<std::string> names;
      for (const auto& n : spec.nodes) names.push_back(n.name);
      metrics = std::make_unique<runtime::metrics_registry>(runtime::metric_role::coordinator, "coordinator",
                                                            std::vector<std::string>{}, names);
      server = std::make_unique<runtime::metrics_server>(
          metrics->registry(), static_cast<int>(config::coordinator_metrics_port(spec)),
          spec.train.metrics.address);
      spdlog::info("coordinator: metrics on http://{}:{}/metrics", spec.train.metrics.address,
                   server->port());
      auto* m = metrics.get();
      o.on_status = [m](const std::vector<comm::member_status>& members) {
        double alive = 0;
        for (const auto& s : members) {
          alive += s.alive ? 1 : 0;
          m->set("longwave_cluster_heartbeat_age_seconds", {{"peer", s.name}}, s.age_s);
        }
        m->set("longwave_cluster_peers_alive", {}, alive);
      };
      o.on_reject = [m](const std::string& reason) {
        m->add("longwave_comm_rejected_frames_total", {{"reason", reason}}, 1);
      };
      o.on_error = [m](const std::string& reason) {
        m->add("longwave_errors_total", {{"reason", reason}}, 1);
      };
      o.on_join = [m](const std::string&, uint64_t) { m->add("longwave_cluster_joins_total", {}, 1); };
      o.on_quorum_wait = [m](double s) { m->set("longwave_cluster_quorum_wait_seconds", {}, s); };
      o.on_refused = [m](const comm::handshake_refusal& r) {
        m->add("longwave_cluster_refused_handshakes_total", {{"reason", r.reason}}, 1);
      };
      o.on_epoch = [m](uint64_t epoch, size_t members, const std::string& reason) {
        m->set("longwave_cluster_epoch", {}, static_cast<double>(epoch));
        m->set("longwave_cluster_members", {}, static_cast<double>(members));
        if (reason != "start") m->add("longwave_cluster_membership_changes_total", {{"reason", reason}}, 1);
      };
    }
    code = comm::run_coordinator(o);
  } catch (const lw_error& e) {
    spdlog::error("{}", e.what());
    code = e.code() == errc::invalid_config ? 2 : 1;
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  return code;
}

int run_node_role(const config::cluster_spec& file_spec, const std::string& name, const run_options& opts) {
  config::train_config cfg;
  size_t index = 0;
  auto spec = file_spec;  // with this node appended when it is not in the file
  // Any running node, one not in the file included: the coordinator knows it by name.
  if (opts.leave) return request_leave(spec, name);
  try {
    const bool listed =
        std::any_of(spec.nodes.begin(), spec.nodes.end(), [&](const auto& n) { return n.name == name; });
    if (listed && !opts.endpoint.empty())
      throw config::config_error("--endpoint",
                                 fmt::format("--endpoint: node {} is in the cluster file, which gives "
                                             "its endpoint; --endpoint is for nodes that are not",
                                             name));
    if (!listed && !opts.endpoint.empty())
      index = config::add_open_node(spec, name, opts.endpoint, opts.workers);
    else
      index = config::node_index(spec, name);
    cfg = config::node_config(spec, index);
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  const auto& me = spec.nodes[index];
  warn_if_unsecured(spec, "node " + me.name);
  if (opts.dry_run) {
    spdlog::info("node {}: rank {} of {}, {} workers (global ranks {}..{}), ring endpoint {}", me.name, index,
                 spec.nodes.size(), me.workers, config::worker_offset(spec, index),
                 config::worker_offset(spec, index) + me.workers - 1, me.endpoint);
    return run_training(cfg, opts);
  }

  cluster_role role;
  run_options node_opts = opts;
  std::unique_ptr<comm::control_client> control;
  std::unique_ptr<state_publisher> publisher;
  std::optional<comm::recover_msg> recover;
  std::optional<comm::curve_server_keys> curve;  // this node's ring and state sockets
  bool cluster_stopped = false;                  // turned away while joining: the cluster stops
  try {
    const auto keys = node_keys(spec, me.name);
    if (keys) {
      role.admitted = std::make_shared<comm::key_ring>();
      // Refusals on the ring and state sockets (a stranger, a removed node's old key): logged, the first 20
      // and then every 1000th (a flood must not fill the log).
      auto refused = std::make_shared<std::atomic<uint64_t>>(0);
      curve =
          comm::curve_server_keys{keys->own, role.admitted, [refused, name = me.name](const auto& r) {
                                    const uint64_t n = ++*refused;
                                    if (n <= 20 || n % 1000 == 0)
                                      spdlog::warn("node {}: {} ({} refused so far)", name, r.describe(), n);
                                  }};
    }
    // Joiners fetch the running cluster's state from its members (the ring backend's clusters are elastic).
    if (spec.train.comm.backend == config::comm_backend::ring)
      publisher = std::make_unique<state_publisher>(me.endpoint, spec.cluster_id, curve);
    control = std::make_unique<comm::control_client>(spec.coordinators, spec.cluster_id, control_curve(keys));
    node_opts.max_resume_round = join(*control, spec, index, opts.fresh ? 0 : latest_checkpoint_round(cfg),
                                      publisher ? publisher->endpoint() : "", role, recover);
  } catch (const lw_error& e) {
    if (e.code() == errc::cancelled) {
      spdlog::info("node {}: {}", me.name, e.what());
      return 0;
    }
    spdlog::error("node {}: {}", me.name, e.what());
    return e.code() == errc::invalid_config ? 2 : 1;
  }
  if (recover) {
    spdlog::info("node {}: the cluster is already training (epoch {}, round {}): joining it", me.name,
                 recover->epoch, recover->round);
    node_opts.max_resume_round.reset();
    role.join = [j = joiner(*control, spec, index, *recover, role), &cluster_stopped](
                    const runtime::snapshot_shape& shape, uint64_t own_round) mutable {
      try {
        return j(shape, own_round);
      } catch (const lw_error& e) {
        cluster_stopped = e.code() == errc::cancelled;  // not admitted: the cluster is stopping
        throw;
      }
    };
  }
  if (publisher) role.publish = [p = publisher.get()](runtime::checkpoint c) { p->publish(std::move(c)); };
  // A node not in the file reads the data regions the coordinator gave it.
  role.rank_offset = index < file_spec.nodes.size() || !recover
                         ? config::worker_offset(spec, index)
                         : static_cast<int64_t>(recover->worker_offset);
  role.cluster_workers = spec.train.train.workers;
  role.data_partitions = config::data_partitions(spec);
  role.ring = ring_options_from(cfg, spec.cluster_id);
  if (curve) role.ring.curve = comm::ring_curve{curve->own, curve->on_refused};
  role.ring.names = role.names;
  if (const char* fault = std::getenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE")) {
    unsigned long long r = 0, c = 0;
    if (std::sscanf(fault, "%llu:%llu", &r, &c) == 2) {
      role.ring.die_in_round = r;
      role.ring.die_after_chunks = c;
      spdlog::warn(
          "node {}: LONGWAVE_FAULT_DIE_IN_ALLREDUCE: this node kills itself in round {} after {} chunks",
          me.name, r, c);
    }
  }
  // A stalled ring says which rank, node and endpoint it waits for (after 10 s, then every 30 s).
  role.ring.on_stall = [name = me.name](const std::string& line) { spdlog::warn("node {}: {}", name, line); };
  // The first tick heartbeats at once: the coordinator allows a member join_timeout_s of silence only until
  // its first heartbeat (while it loads its data and model).
  std::chrono::steady_clock::time_point last_beat{};
  coordinator_watch watch(hello_of(spec, index, 0, publisher ? publisher->endpoint() : ""), role.admitted);
  bool leaving = false;
  stop_follower stop(me.name);
  // Every policy but eager keeps one theta_global on every node (eager mixes in each node's own delta).
  auto committed = std::make_shared<committed_rounds>();
  if (cfg.diloco.outer != config::outer_policy_kind::eager)
    role.round_committed = [committed](uint64_t round, uint32_t crc) { committed->push(round, crc); };
  role.tick = [&](comm::collective& ring, const std::function<void(std::string)>& record,
                  const node_controls& controls) {
    const auto now = std::chrono::steady_clock::now();
    const auto asks = watch.on_tick(*control, ring, me.name, now, record);
    if (asks.leave && !leaving) {
      leaving = true;
      spdlog::info("node {}: asked to leave the cluster: stopping at the next round boundary", me.name);
      controls.leave();
    }
    stop.on_tick(asks, *control, controls, record, now);
    for (const auto& [round, crc] : committed->take()) control->committed(round, crc);
    if (now - last_beat < std::chrono::seconds(2)) return;
    last_beat = now;
    const auto* elastic = dynamic_cast<const comm::elastic_ring*>(&ring);
    control->heartbeat(ring.completed_round(), elastic ? elastic->epoch() : 0);
  };
  int code = run_training(cfg, node_opts, &role);
  if ((stop.round() || cluster_stopped) && code == 130) {
    control->bye("stopped");
    if (stop.round())
      spdlog::info(
          "node {}: stopped with the cluster after round {}; its checkpoint is saved (the same "
          "command resumes)",
          me.name, *stop.round());
    return 0;
  }
  if (leaving && code == 130) {
    control->bye("left at a round boundary (longwave node --leave)");
    spdlog::info("node {}: left the cluster; its checkpoint is saved", me.name);
    return 0;
  }
  if (code == 0)
    control->bye("done");
  else if (code == 130)
    control->bye("interrupted (Ctrl-C); its checkpoint is saved");
  else
    control->error(errc::peer_lost,
                   "node " + me.name + " stopped with exit code " + std::to_string(code) + "; see its log");
  return code;
}

}  // namespace longwave::actors
