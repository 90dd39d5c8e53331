// In-process ring links: a member's frames wait in its own send queue (send_hwm) until the next rank's
// mailbox (recv_hwm) has room, as ZeroMQ's PUSH queue waits for a slow or absent PULL peer.
#include "comm/inproc_transport.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "comm/io_thread.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

class inproc_transport final : public transport {
 public:
  inproc_transport(std::shared_ptr<inproc_hub> hub, transport_options opts)
      : hub_(std::move(hub)), opts_(std::move(opts)) {
    thread_.start(
        [this] { open(); }, [this] { close(); },
        [this](const char* e) { return fmt::format("comm: cannot bind {}: {}", opts_.bind_endpoint, e); });
  }
  ~inproc_transport() override { thread_.stop(); }

  std::future<void> submit(std::function<void()> fn) override { return thread_.submit(std::move(fn)); }
  bool stopping() const override { return thread_.stopping(); }
  void drop_queued_on_close() override { drop_on_close_.store(true, std::memory_order_release); }
  const std::string& bound_endpoint() const override { return opts_.bind_endpoint; }

  bool try_send(zmq::message_t& header, zmq::message_t& payload) override {
    std::lock_guard<std::mutex> lk(hub_->mu_);
    flush_locked();
    if (outbox_.size() >= static_cast<size_t>(opts_.send_hwm)) return false;
    inproc_hub::message m;
    m.parts.push_back(std::move(header));
    m.parts.push_back(std::move(payload));
    m.from = opts_.bind_endpoint;
    outbox_.push_back(std::move(m));
    flush_locked();
    return true;
  }

  bool try_recv(inbound_message& out, size_t max_parts) override {
    out.parts.clear();
    out.extra_parts = 0;
    out.bytes = 0;
    out.peer.clear();
    std::lock_guard<std::mutex> lk(hub_->mu_);
    flush_locked();
    auto& box = hub_->boxes_.at(opts_.bind_endpoint);
    if (box.queue.empty()) return false;
    inproc_hub::message m = std::move(box.queue.front());
    box.queue.pop_front();
    hub_->cv_.notify_all();  // a sender waiting for room
    out.peer = m.from;
    for (auto& p : m.parts) {
      out.bytes += p.size();
      if (out.parts.size() < max_parts)
        out.parts.push_back(std::move(p));
      else
        ++out.extra_parts;
    }
    return true;
  }

  void wait(bool want_send, bool want_recv, std::chrono::steady_clock::time_point until) override {
    std::unique_lock<std::mutex> lk(hub_->mu_);
    const auto slice = std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
    hub_->cv_.wait_until(lk, slice, [&] {
      flush_locked();
      if (stopping() || std::exchange(link_changed_, false)) return true;
      if (want_recv && !hub_->boxes_.at(opts_.bind_endpoint).queue.empty()) return true;
      return want_send && outbox_.size() < static_cast<size_t>(opts_.send_hwm);
    });
  }

  std::optional<std::string> link_lost() override {
    std::lock_guard<std::mutex> lk(hub_->mu_);
    flush_locked();
    return lost_;
  }

 private:
  void open() {
    std::lock_guard<std::mutex> lk(hub_->mu_);
    auto [it, fresh] = hub_->boxes_.try_emplace(opts_.bind_endpoint);
    if (!fresh) throw lw_error(errc::io_error, "the endpoint is already bound in this hub");
    it->second.hwm = static_cast<size_t>(std::max(1, opts_.recv_hwm));
    it->second.max_bytes = opts_.max_frame_bytes;
    it->second.generation = ++hub_->generations_;
    hub_->cv_.notify_all();
  }

  void close() {
    std::lock_guard<std::mutex> lk(hub_->mu_);
    // Lingering: what is still queued goes to the next rank at once if it is there (its mailbox may grow
    // past its mark), unless the ring failed and nobody waits for it.
    if (!drop_on_close_.load(std::memory_order_acquire)) flush_locked(true);
    hub_->boxes_.erase(opts_.bind_endpoint);
    hub_->cv_.notify_all();
  }

  // Moves queued frames into the next rank's mailbox while it has room; tracks the link's state. Under mu_.
  void flush_locked(bool ignore_hwm = false) {
    if (opts_.connect_endpoint.empty()) return;
    auto it = hub_->boxes_.find(opts_.connect_endpoint);
    const bool cut = hub_->cut_.count({opts_.bind_endpoint, opts_.connect_endpoint}) > 0;
    if (it == hub_->boxes_.end() || cut) {
      if (connected_ && !lost_) {
        lost_ = fmt::format("connection to {} lost", opts_.connect_endpoint);
        link_changed_ = true;
      }
      if (cut) outbox_.clear();
      connected_ = false;
      return;
    }
    if (!connected_ || it->second.generation != peer_generation_) {
      connected_ = true;
      peer_generation_ = it->second.generation;
      lost_.reset();
      link_changed_ = true;
    }
    bool moved = false;
    while (!outbox_.empty() && (ignore_hwm || it->second.queue.size() < it->second.hwm)) {
      inproc_hub::message m = std::move(outbox_.front());
      outbox_.pop_front();
      size_t bytes = 0;
      for (const auto& p : m.parts) bytes += p.size();
      if (it->second.max_bytes >= 0 && bytes > static_cast<size_t>(it->second.max_bytes)) continue;
      it->second.queue.push_back(std::move(m));
      moved = true;
    }
    if (moved) hub_->cv_.notify_all();
  }

  std::shared_ptr<inproc_hub> hub_;
  transport_options opts_;
  std::deque<inproc_hub::message> outbox_;  // under hub_->mu_
  bool connected_ = false;                  // under hub_->mu_
  uint64_t peer_generation_ = 0;            // under hub_->mu_
  std::optional<std::string> lost_;         // under hub_->mu_
  bool link_changed_ = false;               // since the last wait; under hub_->mu_
  std::atomic<bool> drop_on_close_{false};
  io_thread thread_;  // last: stopped first
};

transport_factory inproc_hub::factory() {
  return [hub = shared_from_this()](transport_options opts) -> std::unique_ptr<transport> {
    return std::make_unique<inproc_transport>(hub, std::move(opts));
  };
}

void inproc_hub::cut(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lk(mu_);
  cut_.insert({from, to});
  cv_.notify_all();
}

void inproc_hub::heal(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lk(mu_);
  cut_.erase({from, to});
  cv_.notify_all();
}

}  // namespace longwave::comm
