// `longwave node CLUSTER.toml --node NAME`: joins the cluster and trains, ticking the control plane from the
// training's main loop.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "actors/run_files.hpp"
#include "actors/run_setup.hpp"
#include "cluster/cluster_file.hpp"
#include "cluster/joiner.hpp"
#include "cluster/node_link.hpp"
#include "cluster/roles.hpp"
#include "cluster/state_publisher.hpp"
#include "comm/fault_transport.hpp"
#include "config/config_loader.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/errors/fault_env.hpp"
#include "runtime/log/log.hpp"
#include "runtime/process/port_check.hpp"
#include "runtime/process/stop_signals.hpp"

namespace longwave::cluster {

namespace {

/// Whether every node holds the same theta after each round (not eager's per-worker outer states, nor async's
/// versions): the master compares the thetas nodes commit, and the checkpoints nodes resume from.
bool same_theta(const config::train_config& cfg) {
  return cfg.diloco.outer != config::outer_policy_kind::eager &&
         cfg.diloco.outer != config::outer_policy_kind::async;
}

/// This node's place in the cluster file (a node not in it, with --endpoint, is appended to spec), and its
/// training settings. Throws config::config_error.
size_t place_of(config::cluster_spec& spec, const std::string& name, const actors::run_options& opts) {
  const bool listed =
      std::any_of(spec.nodes.begin(), spec.nodes.end(), [&](const auto& n) { return n.name == name; });
  if (listed && !opts.endpoint.empty())
    throw config::config_error("--endpoint",
                               fmt::format("--endpoint: node {} is in the cluster file, which gives its "
                                           "endpoint; --endpoint is for nodes that are not",
                                           name));
  if (listed && opts.workers >= 0)
    throw config::config_error("--workers",
                               fmt::format("--workers: node {} is in the cluster file, which gives its "
                                           "workers; --workers is for nodes that are not",
                                           name));
  if (!listed && !opts.endpoint.empty())
    return config::add_open_node(spec, name, opts.endpoint, opts.workers < 0 ? 1 : opts.workers);
  return config::node_index(spec, name);
}

/// What a node sets up before it trains: its place in the ring, the control connection, the state it
/// serves, and where to fetch the running cluster's state (its link to the cluster holds them while it
/// trains).
struct node_session {
  actors::ring_place place;
  std::unique_ptr<control_client> control;
  std::unique_ptr<state_publisher> publisher;
  std::optional<recover_msg> recover;
  hello_msg hello;                               // what it says to the master when it joins
  std::optional<comm::curve_server_keys> curve;  // this node's ring and state sockets
  double slow_start_s = 0;                       // a test fault (slow_start_fault)
};

/// CURVE: this node's keys for its ring and state sockets, and the node keys it admits (place.admitted).
/// Refusals (a stranger, a removed node's old key) are logged, the first 20 and then every 1000th.
void set_up_curve(node_session& s, const comm::cluster_keys& keys, const std::string& name) {
  s.place.admitted = std::make_shared<comm::key_ring>();
  auto refused = std::make_shared<std::atomic<uint64_t>>(0);
  s.curve =
      comm::curve_server_keys{keys.own, s.place.admitted, [refused, name](const auto& r) {
                                const uint64_t n = ++*refused;
                                if (n <= 20 || n % 1000 == 0)
                                  spdlog::warn("node {}: {} ({} refused so far)", name, r.describe(), n);
                              }};
}

/// Sets the place's ring from the config and this node's place; test faults from the environment.
void set_up_ring(node_session& s, const config::cluster_spec& spec, const config::cluster_spec& file_spec,
                 size_t index, const config::train_config& cfg) {
  const auto& me = spec.nodes[index];
  // A node not in the file reads the data regions the master gave it.
  s.place.rank_offset = index < file_spec.nodes.size() || !s.recover
                            ? config::worker_offset(spec, index)
                            : static_cast<int64_t>(s.recover->worker_offset);
  s.place.cluster_workers = spec.train.train.workers;
  s.place.data_partitions = config::data_partitions(spec);
  s.place.ring = actors::ring_options_from(cfg, spec.cluster_id);
  if (s.curve) s.place.ring.curve = comm::ring_curve{s.curve->own, s.curve->on_refused};
  s.place.ring.names = s.place.names;
  if (const auto faults = comm::transport_faults_from_env()) {
    s.place.ring.transport = comm::with_faults({}, *faults);
    if (faults->die_in_round != 0)
      spdlog::warn(
          "node {}: LONGWAVE_FAULT_DIE_IN_ALLREDUCE: this node kills itself in round {} after {} chunks{}",
          me.name, faults->die_in_round, faults->die_after_chunks,
          faults->hang ? " (its ring hangs there, until the process is killed)" : "");
    if (faults->gate_round != 0)
      spdlog::warn("node {}: LONGWAVE_FAULT_ALLREDUCE_GATE: round {}'s ring frames wait for {}", me.name,
                   faults->gate_round, faults->gate_path);
    if (faults->send_bytes_per_s > 0)
      spdlog::warn("node {}: LONGWAVE_FAULT_RING_RATE: ring frames leave at most {} bytes/s", me.name,
                   faults->send_bytes_per_s);
  }
  // A stalled ring says which rank, node and endpoint it waits for (after 10 s, then every 30 s).
  s.place.ring.on_stall = [name = me.name](const std::string& line) {
    spdlog::warn("node {}: {}", name, line);
  };
}

/// What the node tells the master as it exits, and its exit code.
int say_goodbye(control_client& control, const std::string& name, int code,
                std::optional<uint64_t> stopped_after, std::optional<uint64_t> last_round,
                bool cluster_stopped, bool leaving) {
  if (stopped_after && last_round && code == 130 && *last_round < *stopped_after) {
    // Ctrl-C before the round the cluster stops after: this is no stop with the others.
    control.bye("interrupted (Ctrl-C) before the cluster's stop round; its checkpoint is saved");
    spdlog::warn(
        "node {}: interrupted after round {}, before round {} where the cluster stops; its checkpoint of the "
        "interruption is saved (the same command resumes)",
        name, *last_round, *stopped_after);
    return 130;
  }
  if ((stopped_after || cluster_stopped) && code == 130) {
    control.bye("stopped");
    if (stopped_after)
      spdlog::info(
          "node {}: stopped with the cluster after round {}; its checkpoint is saved (the same command "
          "resumes)",
          name, *stopped_after);
    return 0;
  }
  if (leaving && code == 130) {
    control.bye("left at a round boundary (longwave node --leave)");
    spdlog::info("node {}: left the cluster; its checkpoint is saved", name);
    return 0;
  }
  if (code == 0)
    control.bye("done");
  else if (code == 130)
    control.bye("interrupted (Ctrl-C); its checkpoint is saved");
  else  // errc none: the message carries the cause, the node's first error line
    control.error(
        errc::none,
        fmt::format("exit code {}: {}", code,
                    runtime::first_error_logged().empty() ? "see its log" : runtime::first_error_logged()));
  return code;
}

}  // namespace

namespace {

/// The ports this node listens on, bound (not listened on: no peer can connect meanwhile) and let go before
/// the hello: a port that another process holds fails here, named, instead of after the welcome, when the
/// cluster has started and only loses this node. A host name that does not resolve is left to the listener.
void check_ports(const config::cluster_spec& spec, const config::cluster_node& me,
                 const config::train_config& cfg) {
  const auto fail = [&](int err, const std::string& what, const std::string& where) {
    const auto hint =
        err == EADDRINUSE
            ? fmt::format("another process holds the port: is node {} already running here?", me.name)
        : err == EADDRNOTAVAIL
            ? std::string(
                  "no interface of this machine has that address: is the node started on the machine "
                  "the cluster file names?")
            : "see the cluster file's " + where;
    throw lw_error(errc::invalid_config,
                   fmt::format("{} cannot be bound: {} ({})", what, std::strerror(err), hint));
  };
  if (spec.train.comm.backend == config::comm_backend::ring) {
    // tcp://HOST:PORT, as config::endpoint_problem checked it when the cluster file was read.
    const auto [host, port] = config::host_port(me.endpoint);
    if (const int err = runtime::bind_error(host, static_cast<int>(port)))
      fail(err, "its ring endpoint " + me.endpoint, "[[nodes]] endpoint");
  }
  if (cfg.metrics.enabled && cfg.metrics.port != 0)
    if (const int err = runtime::bind_error(cfg.metrics.address, static_cast<int>(cfg.metrics.port)))
      fail(err, fmt::format("its metrics port {}:{}", cfg.metrics.address, cfg.metrics.port),
           "[[nodes]] metrics_port (0 picks a free one)");
}

/// The node's run.out_dir and checkpoint.dir locks, taken and let go before the hello: a run that holds one
/// (a node of another cluster file, a `longwave run`) stops this node here, not after the cluster formed.
void check_locks(const config::train_config& cfg) {
  const auto p = actors::resolve_paths(cfg);
  actors::make_run_directory("run.out_dir", p.out_dir);
  const runtime::run_lock out(p.out_dir, "run.out_dir");
  std::error_code ec;
  if (std::filesystem::is_directory(p.ckpt_dir, ec) &&
      !std::filesystem::equivalent(p.ckpt_dir, p.out_dir, ec)) {
    const runtime::run_lock ckpt(p.ckpt_dir, "checkpoint.dir");
  }
}

/// Tokenizes the corpus into the node's data directory (cached: a restart reads it back) before the hello:
/// after the welcome the members would wait for it, and the coordinator takes a node that has not sent its
/// first heartbeat within join_timeout_s as lost. Throws as prepare_dataset does.
void prepare_data(const config::train_config& cfg) {
  const auto p = actors::resolve_paths(cfg);
  const auto corpus = actors::corpus_path(cfg);
  actors::make_run_directory("run.out_dir", p.out_dir);
  actors::make_data_directory(cfg, corpus, p.data_dir);
  actors::prepare_data(cfg, corpus, p.data_dir, [](const std::string& line) {
    // The run says which shards it uses as it starts.
    if (line.rfind("data: using", 0) != 0) spdlog::info("{}", line);
  });
}

/// LONGWAVE_FAULT_SLOW_START_S (tests): the seconds this node's start-up after its welcome takes more, as a
/// large checkpoint's load would (0: none).
double slow_start_fault(const std::string& name) {
  const double s = runtime::fault_seconds("LONGWAVE_FAULT_SLOW_START_S");
  if (s > 0) spdlog::warn("node {}: LONGWAVE_FAULT_SLOW_START_S: its start-up takes {} s more", name, s);
  return s;
}

/// LONGWAVE_FAULT_HELLO_GATE (tests): this node waits for that file before its hello, as one still preparing
/// a large corpus would.
void hello_gate(const std::string& name) {
  const char* gate = std::getenv("LONGWAVE_FAULT_HELLO_GATE");
  if (gate == nullptr || *gate == 0) return;
  spdlog::warn("node {}: LONGWAVE_FAULT_HELLO_GATE: waiting for {} before its hello", name, gate);
  while (!std::filesystem::exists(gate)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

/// Keys, the state server, the control connection and the join. The exit code when the node ends here (0:
/// the cluster stopped meanwhile; 1 or 2 with the reason logged), nullopt when it trains.
std::optional<int> connect_and_join(node_session& s, const config::cluster_spec& spec, size_t index,
                                    const config::train_config& cfg, actors::run_options& node_opts) {
  const auto& me = spec.nodes[index];
  try {
    check_ports(spec, me, cfg);
    s.slow_start_s = slow_start_fault(me.name);
    check_locks(cfg);
    prepare_data(cfg);
    const auto keys = node_keys(spec, me.name);
    if (keys) set_up_curve(s, *keys, me.name);
    // Joiners fetch the running cluster's state from its members (the ring backend's clusters are elastic).
    if (spec.train.comm.backend == config::comm_backend::ring)
      s.publisher = std::make_unique<state_publisher>(me.endpoint, spec.cluster_id, s.curve);
    s.control = std::make_unique<control_client>(spec.coordinators, spec.cluster_id, control_curve(keys));
    // One hello, built once (its data fingerprint reads the corpus): the join's, and the one a restarted
    // master is re-announced with.
    const auto held = node_opts.fresh ? std::vector<runtime::held_round>{} : actors::held_checkpoints(cfg);
    const uint64_t newest = held.empty() ? 0 : held.back().round;
    s.hello = hello_of(spec, index, held, s.publisher ? s.publisher->endpoint() : "");
    // eager and async nodes' thetas differ by design: their checkpoints are matched by round alone.
    if (!same_theta(cfg)) s.hello.checkpoint_thetas.clear();
    // async: the master merges on from the newest version a node checkpointed, and every node resumes from
    // its own newest checkpoint (the nodes' rounds are their own; the newest version is adopted by all).
    const bool async = cfg.diloco.outer == config::outer_policy_kind::async;
    if (async && newest > 0) s.hello.committed = {actors::latest_checkpoint_version(cfg), 0};
    hello_gate(me.name);
    node_opts.max_resume_round = join(*s.control, spec, index, s.hello, s.place, s.recover);
    if (async) node_opts.max_resume_round.reset();
    node_opts.cluster_node = true;
  } catch (const runtime::run_lock_busy& e) {
    spdlog::error("node {}: {}", me.name, e.what());
    return 4;
  } catch (const runtime::run_lock_unwritable& e) {
    spdlog::error("node {}: no file can be made in its run.out_dir or checkpoint.dir: {}", me.name, e.what());
    return 2;
  } catch (const lw_error& e) {
    if (e.code() == errc::cancelled) {
      spdlog::info("node {}: {}", me.name, e.what());
      return 0;
    }
    spdlog::error("node {}: {}", me.name, e.what());
    // A corpus that is not text is bad input, as for `longwave run`.
    return e.code() == errc::invalid_config || e.code() == errc::corrupt_data ? 2 : 1;
  } catch (const config::config_error& e) {  // data.path missing, or a device
    spdlog::error("node {}: {}", me.name, e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace

int run_node_role(const config::cluster_spec& file_spec, const std::string& name,
                  const actors::run_options& opts) {
  auto spec = file_spec;  // with this node appended when it is not in the file
  // Any running node, one not in the file included: the master knows it by name.
  if (opts.leave) return request_leave(spec, name);
  size_t index = 0;
  config::train_config cfg;
  try {
    index = place_of(spec, name, opts);
    cfg = config::node_config(spec, index);
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  const auto& me = spec.nodes[index];
  try {  // a malformed LONGWAVE_FAULT_* is refused before the hello (it aborted the node once it had joined)
    (void)comm::transport_faults_from_env();
  } catch (const lw_error& e) {
    spdlog::error("node {}: {}", me.name, e.what());
    return 2;
  }
  warn_if_unsecured(spec, "node " + me.name);
  if (opts.dry_run) {
    try {
      node_keys(spec, me.name);  // CURVE: the keys it would join with are there, private and valid
    } catch (const lw_error& e) {
      spdlog::error("node {}: {}", me.name, e.what());
      return 2;
    }
    spdlog::info("node {}: rank {} of {}, {} workers (global ranks {}..{}), ring endpoint {}", me.name, index,
                 spec.nodes.size(), me.workers, config::worker_offset(spec, index),
                 config::worker_offset(spec, index) + me.workers - 1, me.endpoint);
    auto dry = opts;
    dry.cluster_node = true;  // a node of this cluster: what a single run refuses (async) is checked as one
    return actors::run_training(cfg, dry);
  }

  node_session s;
  actors::run_options node_opts = opts;
  if (const auto failed = connect_and_join(s, spec, index, cfg, node_opts)) return runtime::end_with(*failed);
  set_up_ring(s, spec, file_spec, index, cfg);
  node_link link(me.name, s.place, *s.control, s.hello, s.publisher.get(), same_theta(cfg),
                 std::chrono::milliseconds(static_cast<int64_t>(spec.heartbeat_timeout_s * 1000)));
  if (cfg.diloco.outer == config::outer_policy_kind::async)
    link.end_when_orphaned(std::chrono::milliseconds(static_cast<int64_t>(spec.quorum_timeout_s * 1000)));
  if (s.recover) {
    const bool versions = cfg.diloco.outer == config::outer_policy_kind::async;
    node_opts.max_resume_round.reset();
    spdlog::info("node {}: the cluster is already training (epoch {}, {} {}): joining it", me.name,
                 s.recover->epoch, versions ? "version" : "round", s.recover->round);
    link.join_with(joiner(*s.control, spec, index, s.hello, *s.recover, s.place, versions, same_theta(cfg)));
  }
  // The round it starts after; async counts versions there but phases in its rounds, so is not checked.
  std::optional<uint64_t> started_after;
  if (cfg.diloco.outer != config::outer_policy_kind::async)
    started_after = s.recover ? s.recover->round : node_opts.max_resume_round.value_or(0);
  link.begin_start_up();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.slow_start_s));
  const int code = actors::run_training(cfg, node_opts, link);
  link.end_start_up();
  const auto reached =
      started_after ? std::optional<uint64_t>(std::max(*started_after, link.last_round())) : std::nullopt;
  return runtime::end_with(say_goodbye(*s.control, me.name, code, link.stopped_after(), reached,
                                       link.cluster_stopped(), link.leaving()));
}

}  // namespace longwave::cluster
