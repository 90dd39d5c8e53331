// A member's state publisher (see state_publisher.hpp).
#include "cluster/state_publisher.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>
#include <vector>

#include "cluster/control_text.hpp"

namespace longwave::cluster {

namespace {

/// Logs what the state server refuses, as the control plane logs its drops (control::logged_drops): another
/// cluster's node, noise on the port, a fetcher of another version. A state no longer held ("gone") is a
/// joiner's usual race: not logged.
state_refusal_callback refusal_logger() {
  auto count = std::make_shared<std::atomic<uint64_t>>(0);
  return [count](const std::string& peer, state_reject why, const std::string& message) {
    if (why == state_reject::gone) return;
    const auto n = count->fetch_add(1) + 1;
    if (n > control::logged_drops && n % control::drop_log_every != 0) return;
    spdlog::warn("state server: refused a request from {} ({}): {}{}", peer.empty() ? "a peer" : peer,
                 to_string(why), message,
                 n == control::logged_drops
                     ? fmt::format(" (further refusals: every {}th is logged)", control::drop_log_every)
                     : std::string());
  };
}

}  // namespace

state_publisher::state_publisher(const std::string& ring_endpoint, uint64_t cluster_id,
                                 std::optional<comm::curve_server_keys> curve)
    : server_(ring_endpoint.substr(0, ring_endpoint.rfind(':')) + ":*", cluster_id, std::move(curve),
              refusal_logger()),
      thread_([this] { run(); }) {}

state_publisher::~state_publisher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void state_publisher::publish(runtime::checkpoint c, std::optional<uint64_t> version) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (version && version == last_version_) return;
    last_version_ = version;
    slot_ = std::move(c);
    slot_version_ = version;
  }
  cv_.notify_all();
}

void state_publisher::run() {
  for (;;) {
    runtime::checkpoint c;
    std::optional<uint64_t> version;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || slot_; });
      if (stop_) return;
      c = std::move(*slot_);
      version = slot_version_;
      slot_.reset();
    }
    // Two states per round: what every member holds alike (theta, momentum, a pending average), which a
    // joiner fetches from all members at once, and this node's worker state (with the meta, which names this
    // node's files), which it fetches from one. async: the members share the version only, so the shared
    // part's header names that and step 0, and the own part carries this node's round and step.
    const uint64_t key = version.value_or(c.round);
    runtime::checkpoint shared, own;
    shared.round = key;
    own.round = c.round;
    shared.step = version ? 0 : c.step;
    own.step = c.step;
    own.meta = std::move(c.meta);
    for (auto& b : c.blobs) (b.name.rfind("replica", 0) == 0 ? own : shared).blobs.push_back(std::move(b));
    auto publish = [&](uint32_t part, const runtime::checkpoint& x) {
      server_.publish(comm::reduce_key{key, part}, key,
                      std::make_shared<const std::vector<std::byte>>(runtime::checkpoint_to_bytes(x)));
    };
    publish(own_part, own);
    publish(shared_part, shared);
  }
}

}  // namespace longwave::cluster
