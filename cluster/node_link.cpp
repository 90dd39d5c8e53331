// A training node's link to its cluster (see node_link.hpp).
#include "cluster/node_link.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>

#include "actors/collective_factory.hpp"
#include "comm/deferred_collective.hpp"

namespace longwave::cluster {

node_link::node_link(std::string name, actors::ring_place& place, control_client& control, hello_msg hello,
                     state_publisher* publisher, bool check_theta,
                     std::chrono::milliseconds heartbeat_timeout)
    : name_(std::move(name)),
      place_(place),
      control_(control),
      publisher_(publisher),
      check_theta_(check_theta),
      watch_(std::move(hello), place.admitted, heartbeat_timeout),
      stop_(name_),
      pin_(name_),
      merges_(name_) {}

node_link::~node_link() {
  end_start_up();
}

void node_link::begin_start_up() {
  start_up_beats_ = std::thread([this] {
    for (;;) {  // at once (the master knows it lives past its welcome), then every beat_every
      {
        std::lock_guard<std::mutex> turn(control_mu_);
        try {
          control_.starting();
        } catch (const std::exception& e) {  // never sent: the coordinator's silence rule decides
          spdlog::warn("node {}: could not say it is still starting: {}", name_, e.what());
        }
      }
      std::unique_lock<std::mutex> lk(start_up_mu_);
      if (started_.wait_for(lk, beat_every, [this] { return start_up_over_; })) return;
    }
  });
}

void node_link::end_start_up() {
  {
    std::lock_guard<std::mutex> lk(start_up_mu_);
    start_up_over_ = true;
  }
  started_.notify_all();
  if (start_up_beats_.joinable()) start_up_beats_.join();
}

actors::joined_state node_link::join(const runtime::snapshot_shape& shape, actors::own_checkpoint own) {
  std::lock_guard<std::mutex> turn(control_mu_);  // the joiner beats while it fetches
  try {
    return (*joiner_)(shape, own);
  } catch (const lw_error& e) {
    cluster_stopped_ = e.code() == errc::cancelled;  // not admitted: the cluster is stopping
    throw;
  }
}

std::shared_ptr<comm::collective> node_link::collective(const config::train_config& cfg,
                                                        comm::ring_allreduce::reject_callback on_reject) {
  // Membership changes by epochs: the ring, or NCCL's communicator, is made again among each epoch's members.
  comm::epoch_view first{place_.epoch, static_cast<uint32_t>(place_.rank), place_.names, place_.endpoints,
                         place_.public_keys};
  if (cfg.comm.backend == config::comm_backend::ring)
    elastic_ = std::make_shared<comm::elastic_ring>(std::move(first), place_.ring, std::move(on_reject),
                                                    place_.committed);
  else
    elastic_ = std::make_shared<comm::elastic_ring>(std::move(first), nccl_epochs(cfg), place_.ring.timeout,
                                                    place_.committed);
  ring_ = elastic_;
  return ring_;
}

comm::elastic_ring::epoch_factory node_link::nccl_epochs(const config::train_config& cfg) {
  nccl_ids_ = std::make_shared<comm::epoch_keys>();
  watch_.take_nccl_ids(nccl_ids_);
  // A communicator per epoch. The first is made here, at start-up, with the id from its rank 0. A later
  // epoch's rank 0 makes its id on entering it and the master hands it on; each member makes the
  // communicator at its first all-reduce (comm::deferred_collective), on the communicator's thread, so that
  // the main thread goes on ticking while NCCL waits for every member.
  return [this, cfg, first = place_.epoch](const comm::epoch_view& v) -> std::shared_ptr<comm::collective> {
    const int rank = static_cast<int>(v.rank), world = static_cast<int>(v.names.size());
    if (v.epoch == first) return actors::make_nccl_collective(cfg, place_.ring, rank, world, nccl_id(cfg));
    if (rank == 0) {
      auto id = actors::make_nccl_id();
      control_.nccl_id(v.epoch, id);
      nccl_ids_->put(v.epoch, std::move(id));
    }
    auto make = [cfg, ring = place_.ring, rank, world](const std::string& id,
                                                       const std::function<void()>& abandon) {
      return actors::make_nccl_collective(cfg, ring, rank, world, id, abandon);  // a fence abandons the join
    };
    return std::make_shared<comm::deferred_collective>(rank, world, v.epoch, "nccl", SIZE_MAX, nccl_ids_,
                                                       std::move(make), nccl_id_timeout(cfg));
  };
}

std::string node_link::nccl_id(const config::train_config& cfg) {
  // The first epoch's id comes over the control connection, in turns with the start-up beats; the
  // communicator is made after it, without the connection, while the beats go on.
  std::lock_guard<std::mutex> turn(control_mu_);
  if (place_.rank == 0) {
    auto id = actors::make_nccl_id();
    control_.nccl_id(place_.epoch, id);
    return id;
  }
  spdlog::info("node {}: waiting for epoch {}'s NCCL id from its rank 0 ({})", name_, place_.epoch,
               place_.names.empty() ? "?" : place_.names[0]);
  return control_.wait_nccl_id(place_.epoch, nccl_id_timeout(cfg));
}

std::chrono::milliseconds node_link::nccl_id_timeout(const config::train_config& cfg) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(60.0, cfg.comm.timeout_s) * 1000));
}

void node_link::publish(runtime::checkpoint state, std::optional<uint64_t> version) {
  if (publisher_) publisher_->publish(std::move(state), version);
}

void node_link::round_committed(uint64_t round, uint32_t theta_crc) {
  last_round_ = std::max(last_round_.load(), round);
  if (check_theta_) committed_.push(round, theta_crc);
}

void node_link::tick(const std::function<void(std::string)>& record, const actors::node_controls& controls) {
  if (!ring_) return;
  if (!start_up_over_) end_start_up();  // the main loop runs: its heartbeats take over
  const auto now = steady::now();
  const auto applied = version_.load();
  if (applied > 0) watch_.version_applied(applied);
  watch_.merges_told(merges_.unapplied(applied));
  const auto asks = watch_.on_tick(control_, *ring_, elastic_.get(), name_, now, record);
  if (asks.leave && !leaving_) {
    leaving_ = true;
    spdlog::info("node {}: asked to leave the cluster: stopping at the next round boundary", name_);
    controls.leave();
  }
  // Evicted, or the run called off: no round of this node counts any more, so it ends now rather than when
  // its next all-reduce fails (a whole inner phase later).
  if ((asks.evicted || asks.cut_off) && !ended_ && controls.end) {
    ended_ = true;
    controls.end(asks.evicted ? "the coordinator says: " + *asks.evicted : *asks.cut_off);
  }
  if (orphaned_after_ && !ended_ && controls.end) {
    const auto gone = watch_.gone_since();
    if (gone && now - *gone >= *orphaned_after_) {
      ended_ = true;
      controls.end(fmt::format(
          "no coordinator for {:.0f} s ([cluster] quorum_timeout_s): without one no merge comes, so this "
          "node's phases would never reach the run. Its checkpoints are kept: start it again with the same "
          "command once a coordinator runs",
          std::chrono::duration<double>(now - *gone).count()));
    }
  }
  stop_.on_tick(asks, control_, controls, record, now);
  if (!stop_.round()) pin_.on_tick(asks, control_, controls);
  merges_.on_tick(asks, control_, controls);
  for (const auto& [round, crc] : committed_.take()) control_.committed(round, crc);
  if (now - last_beat_ < beat_every) return;
  last_beat_ = now;
  control_.heartbeat(ring_->completed_round(), elastic_ ? elastic_->epoch() : 0);
}

}  // namespace longwave::cluster
