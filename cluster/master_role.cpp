// `longwave coordinator CLUSTER.toml`: the master role with its settings from the cluster file, its
// /metrics, and Ctrl-C.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string_view>

#include "cluster/cluster_file.hpp"
#include "cluster/master.hpp"
#include "cluster/master_role.hpp"
#include "cluster/standby.hpp"
#include "config/config_loader.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/json/json_reader.hpp"
#include "runtime/metrics/metrics_registry.hpp"
#include "runtime/metrics/metrics_server.hpp"
#include "runtime/process/stop_signals.hpp"

namespace longwave::cluster {

namespace {

std::atomic<int> g_coordinator_signals{0};

void on_coordinator_signal(int) {
  g_coordinator_signals.fetch_add(1);
}

/// The master's rules and endpoint from the cluster file.
master_options options_of(const config::cluster_spec& spec, const std::string& bind, size_t slot) {
  master_options o;
  o.bind_endpoint = bind;
  o.term_slot = static_cast<uint32_t>(slot);
  o.cluster_id = spec.cluster_id;
  o.config_hash = cluster_fingerprint(spec, spec.train);
  o.training_settings = config::training_settings(spec.train);
  o.open = spec.open;
  o.open_workers = static_cast<uint32_t>(spec.open_workers);
  for (const auto& n : spec.nodes)
    o.members.push_back({n.name, n.endpoint, static_cast<uint32_t>(n.workers)});
  o.join_timeout = to_ms(spec.join_timeout_s);
  o.heartbeat_timeout = to_ms(spec.heartbeat_timeout_s);
  o.min_nodes = static_cast<size_t>(spec.min_nodes);
  o.quorum_timeout = to_ms(spec.quorum_timeout_s);
  o.await_last_words = spec.coordinators.size() > 1;  // the nodes' ZMQ_IMMEDIATE (control_client_links)
  if (spec.train.diloco.outer == config::outer_policy_kind::async) {
    const auto& a = spec.train.async;
    o.async = merge_rules{a.quorum,        a.grace_min_s,   a.grace_max_s,
                          a.max_staleness, a.max_in_flight, spec.train.train.rounds};
  }
  o.info = [](const std::string& s) { spdlog::info("{}", s); };
  o.warn = [](const std::string& s) { spdlog::warn("{}", s); };
  return o;
}

/// CURVE: the coordinator's keys and the node keys it admits (read again when an unknown key knocks). False
/// (logged) when the key directory cannot be read.
bool load_keys(const config::cluster_spec& spec, master_options& o) {
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
    return true;
  } catch (const lw_error& e) {
    spdlog::error("coordinator: {}", e.what());
    return false;
  }
}

/// The coordinator's own /metrics: membership, heartbeat ages, rejected control frames, errors.
void report_to(runtime::metrics_registry* m, master_options& o) {
  o.on_status = [m](const std::vector<member_status>& members) {
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
  o.on_error = [m](const std::string& reason) { m->add("longwave_errors_total", {{"reason", reason}}, 1); };
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

/// One cluster's coordinators per run.out_dir: each holds a shared flock on
/// <out_dir>/.coordinator-<cluster hash>.lock (a standby, a restarted or a suspended one of this cluster
/// share it and its event log) and finds no other cluster's such file locked. Another cluster's live
/// coordinator there is a run_lock_busy (exit 4) before this one writes to coordinator.jsonl. The returned
/// descriptor holds the lock until the process ends.
int take_coordinator_lock(const config::cluster_spec& spec) {
  namespace fs = std::filesystem;
  const fs::path dir = spec.train.run.out_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const auto own = fmt::format(".coordinator-{:016x}.lock", spec.cluster_id);
  const int fd = ::open((dir / own).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || ::flock(fd, LOCK_SH) != 0) {
    spdlog::warn("coordinator: cannot lock {}: {}; another cluster's coordinator there is not detected",
                 (dir / own).string(), std::strerror(errno));
    return fd;
  }
  if (::ftruncate(fd, 0) == 0) (void)!::write(fd, (spec.id + "\n").data(), spec.id.size() + 1);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (name == own || name.rfind(".coordinator-", 0) != 0 || name.size() < 5 ||
        name.compare(name.size() - 5, 5, ".lock") != 0)
      continue;
    const int other = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (other < 0) continue;
    const bool live = ::flock(other, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    std::string id;
    std::ifstream in(entry.path());
    std::getline(in, id);
    ::close(other);
    if (live)
      throw runtime::run_lock_busy(
          fmt::format(
              "run.out_dir {} is in use by the coordinator of another cluster ('{}'): two cluster files "
              "with one run.out_dir would write one event log; give this cluster a run.out_dir of "
              "its own, or stop the other",
              dir.string(), id),
          "unknown");
  }
  return fd;
}

/// The event log, <run.out_dir>/coordinator.jsonl (no node directory has a '.' in its name): appended to by
/// every master of the cluster that leads on this machine, so a takeover continues it. A log that cannot be
/// written is named once; the master goes on without it.
void record_to(const std::string& out_dir, master_options& o) {
  const auto path = std::filesystem::path(out_dir) / "coordinator.jsonl";
  auto out = std::make_shared<std::ofstream>();
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  out->open(path, std::ios::app);
  if (!*out) {
    spdlog::warn("coordinator: cannot write its event log {}: {}", path.string(),
                 ec ? ec.message() : "cannot open it for appending");
    return;
  }
  spdlog::info("coordinator: event log {}", path.string());
  o.on_record = [out, path, failed = false](const std::string& json) mutable {
    *out << json << '\n' << std::flush;
    if (!*out && !failed) {
      failed = true;
      spdlog::warn("coordinator: cannot append to its event log {}; later events are not in it",
                   path.string());
    }
  };
}

/// The event log's last stop (`longwave stop`) after which the cluster trained no more: a resume goes on
/// from its round (master_settings::stopped). No log, or training (an epoch, a takeover) since: none. The
/// end of a session that never trained (called off at the join deadline, Ctrl-C before the welcome) keeps it.
std::optional<master_settings::stopped_run> last_stop(const std::string& out_dir) {
  std::ifstream in(std::filesystem::path(out_dir) / "coordinator.jsonl");
  std::optional<master_settings::stopped_run> out;
  for (std::string line; std::getline(in, line);) {
    rapidjson::Document doc;
    if (runtime::parse_json(line, doc)) continue;  // a line cut short by a crash
    const auto* kind = runtime::find_member(doc, "kind");
    if (!kind || !kind->IsString()) continue;
    const std::string_view k = kind->GetString();
    if (k == "epoch" || k == "takeover") out.reset();  // training went on after it: its rounds count
    if (k != "end") continue;
    const auto* outcome = runtime::find_member(doc, "outcome");
    const auto* round = runtime::find_member(doc, "stop_round");
    const auto* nodes = runtime::find_member(doc, "finished");
    if (!outcome || !outcome->IsString() || std::string_view(outcome->GetString()) != "stopped" || !round ||
        !round->IsUint64() || !nodes || !nodes->IsString())
      continue;
    master_settings::stopped_run s;
    s.round = round->GetUint64();
    std::istringstream list(nodes->GetString());
    for (std::string name; std::getline(list, name, ',');)
      if (!name.empty()) s.nodes.push_back(name);
    out = std::move(s);
  }
  return out;
}

/// Stands by while a master at another of the cluster's addresses answers, then runs this one; `leads` is
/// called once it does (a standby serves /metrics only then: it may share the leader's port on one host).
int lead(const config::cluster_spec& spec, const master_options& o,
         const std::function<void(master_options&)>& leads) {
  standby_options sb;
  for (const auto& c : spec.coordinators)
    if (c != o.bind_endpoint) sb.others.push_back(c);
  if (o.node_keys) sb.curve = o.curve;
  sb.cluster_id = spec.cluster_id;
  sb.address = o.bind_endpoint;
  sb.silence = o.heartbeat_timeout;
  sb.stop = o.stop;
  sb.info = o.info;
  const auto [end, said] = stand_by(sb);
  if (end == standby_end::stopped) return 130;
  if (end == standby_end::foreign) {  // as a node turned away by it: a config error
    spdlog::error("coordinator: {}", said);
    return 2;
  }
  if (end == standby_end::ended) {  // nothing to lead: the event log's end record is the leader's
    if (o.info) o.info(fmt::format("coordinator: the coordinator that led says {}; this standby ends", said));
    return 0;
  }
  master_options leading = o;
  leading.took_over = end == standby_end::take_over;
  leads(leading);
  return run_master(leading);
}

}  // namespace

int run_master_role(const config::cluster_spec& spec, const std::string& bind) {
  const std::string endpoint = bind.empty() ? spec.coordinator : bind;
  const auto slot = std::find(spec.coordinators.begin(), spec.coordinators.end(), endpoint);
  if (slot == spec.coordinators.end()) {
    spdlog::error(
        "coordinator: --bind {} is not one of [cluster] coordinator's addresses ({}): the nodes would "
        "not find it",
        endpoint, fmt::join(spec.coordinators, ", "));
    return 2;
  }
  auto o = options_of(spec, endpoint, static_cast<size_t>(slot - spec.coordinators.begin()));
  warn_if_unsecured(spec, "coordinator");
  if (spec.security.mode == config::security_mode::curve && !load_keys(spec, o)) return 2;
  g_coordinator_signals = 0;
  std::signal(SIGINT, on_coordinator_signal);
  std::signal(SIGTERM, on_coordinator_signal);
  o.stop = [] { return g_coordinator_signals.load() > 0; };
  int code = 1;
  try {
    take_coordinator_lock(spec);
    o.stopped = last_stop(spec.train.run.out_dir);
    record_to(spec.train.run.out_dir, o);
    std::unique_ptr<runtime::metrics_registry> metrics;
    std::unique_ptr<runtime::metrics_server> server;
    const auto serve_metrics = [&](master_options& leading) {
      if (!spec.train.metrics.enabled) return;
      std::vector<std::string> names;
      for (const auto& n : spec.nodes) names.push_back(n.name);
      metrics = std::make_unique<runtime::metrics_registry>(runtime::metric_role::coordinator, "coordinator",
                                                            std::vector<std::string>{}, names);
      server = std::make_unique<runtime::metrics_server>(
          metrics->registry(), static_cast<int>(config::coordinator_metrics_port(spec)),
          spec.train.metrics.address);
      spdlog::info("coordinator: metrics on http://{}:{}/metrics", spec.train.metrics.address,
                   server->port());
      report_to(metrics.get(), leading);
    };
    // One address: a port in use is a start-up error. Several: a standby may share its leader's port on one
    // host, so it binds once it leads; a leader it took over from while paused may still hold it.
    const bool standby = spec.coordinators.size() > 1;
    if (!standby) serve_metrics(o);
    code = lead(spec, o, [&](master_options& leading) {
      if (!standby) return;
      try {
        serve_metrics(leading);
      } catch (const lw_error& e) {
        metrics.reset();
        spdlog::warn("coordinator: /metrics is not served ({}); it leads without it", e.what());
      }
    });
  } catch (const runtime::run_lock_busy& e) {
    spdlog::error("coordinator: {}", e.what());
    code = 4;
  } catch (const lw_error& e) {
    spdlog::error("{}", e.what());
    code = e.code() == errc::invalid_config ? 2 : 1;
  }
  // Ended: a late Ctrl-C or SIGTERM (launch stopping the roles after a node failed) keeps the code.
  return runtime::end_with(code);
}

}  // namespace longwave::cluster
