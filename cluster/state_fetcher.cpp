// State transfer's fetching side (see state_fetcher.hpp). The fetcher drives one DEALER per peer from a
// single poll loop: a queue of chunks, a window of requests per peer, and a peer that errs has its chunks put
// back at the front of the queue.
#include "cluster/state_fetcher.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <zmq.hpp>

#include "cluster/control_text.hpp"
#include "cluster/state_offers.hpp"
#include "comm/zmq_monitor.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::cluster {

using namespace comm;  // CURVE, ZAP and socket monitors
using runtime::crc32c;
using clock = std::chrono::steady_clock;

namespace {

constexpr auto poll_slice = std::chrono::milliseconds(50);
// Offers are awaited from every peer, but no longer than this after the first one arrived: a dead peer does
// not hold the download up (its offer is still taken if it comes later).
constexpr auto offer_grace = std::chrono::milliseconds(500);

class fetcher {
 public:
  fetcher(const std::vector<std::string>& peers, uint64_t cluster_id, const fetch_options& opts)
      : cluster_id_(cluster_id), opts_(opts) {
    peer_stall_ = opts.peer_stall.count() > 0
                      ? opts.peer_stall
                      : std::max<std::chrono::milliseconds>(std::chrono::seconds(1), opts.timeout / 3);
    peers_.resize(peers.size());
    for (size_t i = 0; i < peers.size(); ++i) peers_[i].endpoint = peers[i];
  }

  ~fetcher() {
    // Stop the monitors first, so closing the DEALERs does not wait on them.
    for (auto& p : peers_)
      if (p.monitor) {
        zmq_socket_monitor(p.sock->handle(), nullptr, 0);
        p.monitor.reset();
      }
  }
  fetcher(const fetcher&) = delete;
  fetcher& operator=(const fetcher&) = delete;

  fetched_state run() {
    const auto start = clock::now();
    last_progress_ = start;
    if (peers_.empty()) throw lw_error(errc::peer_lost, "state transfer: no peers to fetch the state from");
    for (size_t i = 0; i < peers_.size(); ++i) open(i);
    auto next_tick = start + std::chrono::seconds(1);
    while (!done()) {
      step();
      const auto now = clock::now();
      if (now - last_progress_ > opts_.timeout) fail_deadline();
      if (opts_.tick && now >= next_tick) {
        next_tick = now + std::chrono::seconds(1);
        opts_.tick();
      }
    }
    fetched_state out;
    out.key = chosen_->key;
    out.round = chosen_->round;
    const uint32_t sum = crc32c(buffer_.data(), buffer_.size());
    if (sum != chosen_->checksum)
      throw lw_error(
          errc::malformed_frame,
          fmt::format("state transfer: state {} has CRC-32C {:08x} though its blocks match the offer "
                      "of {}, which announced {:08x}",
                      key_text(chosen_->key), sum, sources_text(), chosen_->checksum));
    report_progress(true);
    out.bytes = std::move(buffer_);
    out.seconds = std::chrono::duration<double>(clock::now() - start).count();
    for (auto& p : peers_) {
      out.bytes_per_peer.push_back(p.bytes);
      if (p.phase != peer_phase::source && !p.cause.empty())
        out.dropped.push_back(p.endpoint + ": " + p.cause);
    }
    return out;
  }

 private:
  void open(size_t i) {
    auto& p = peers_[i];
    p.sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    p.sock->set(zmq::sockopt::linger, 0);
    p.sock->set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(std::max<uint64_t>(max_state_chunk_bytes, max_state_reply_bytes)));
    if (opts_.curve) {
      if (i >= opts_.peer_keys.size() || !is_z85_key(opts_.peer_keys[i])) {
        drop(i, drop_kind::io, "no CURVE public key for this peer");
        return;
      }
      make_curve_client(*p.sock, *opts_.curve, opts_.peer_keys[i]);
    }
    const auto monitor_endpoint = fmt::format("inproc://longwave-state-fetch-{}", i);
    if (zmq_socket_monitor(p.sock->handle(), monitor_endpoint.c_str(),
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) == 0) {
      p.monitor = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
      p.monitor->set(zmq::sockopt::linger, 0);
      p.monitor->connect(monitor_endpoint);
    }
    try {
      p.sock->connect(p.endpoint);
    } catch (const zmq::error_t& e) {
      drop(i, drop_kind::io, fmt::format("cannot connect: {}", e.what()));
      return;
    }
    p.last_heard = clock::now();
    state_request r;
    r.cluster_id = cluster_id_;
    r.request_id = next_request_++;
    send(i, r);
  }

  bool send(size_t i, const state_request& r) {
    auto m = build_request(r);
    try {
      return peers_[i].sock->send(m, zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      drop(i, drop_kind::io, fmt::format("send failed: {}", e.what()));
      return false;
    }
  }

  void drop(size_t i, drop_kind why, std::string cause) {
    auto& p = peers_[i];
    if (p.phase == peer_phase::dropped) return;
    p.phase = peer_phase::dropped;
    p.why = why;
    p.cause = std::move(cause);
    for (auto it = p.outstanding.rbegin(); it != p.outstanding.rend(); ++it) {
      pending_.push_front(it->second);  // the oldest first
    }
    p.outstanding.clear();
    if (p.monitor) {
      zmq_socket_monitor(p.sock->handle(), nullptr, 0);
      p.monitor.reset();
    }
    p.sock.reset();
  }

  bool done() const { return chosen_ && n_done_ == plan_.n_chunks; }

  // One poll over every open socket and monitor, then the replies, the choice, the requests and the clocks.
  void step() {
    std::vector<zmq::pollitem_t> items;
    std::vector<std::pair<size_t, bool>> owner;  // peer, is its monitor
    for (size_t i = 0; i < peers_.size(); ++i) {
      auto& p = peers_[i];
      if (p.phase == peer_phase::dropped) continue;
      items.push_back({static_cast<void*>(*p.sock), 0, ZMQ_POLLIN, 0});
      owner.emplace_back(i, false);
      if (p.monitor) {
        items.push_back({static_cast<void*>(*p.monitor), 0, ZMQ_POLLIN, 0});
        owner.emplace_back(i, true);
      }
    }
    if (!poll(items)) return;
    for (size_t k = 0; k < items.size(); ++k) {
      const auto [i, is_monitor] = owner[k];
      if (!(items[k].revents & ZMQ_POLLIN) || peers_[i].phase == peer_phase::dropped) continue;
      if (is_monitor)
        drain_monitor(i);
      else
        receive(i);
    }
    if (!chosen_) choose();
    if (chosen_) {
      dispatch();
      check_stalls();
      check_sources_left();
    } else {
      check_nothing_offered();
    }
  }

  // False when a signal cut the poll short (the caller polls again).
  static bool poll(std::vector<zmq::pollitem_t>& items) {
    if (items.empty()) {
      std::this_thread::sleep_for(poll_slice);
      return true;
    }
    try {
      zmq::poll(items.data(), items.size(), poll_slice);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw lw_error(errc::io_error, fmt::format("state transfer: poll: {}", e.what()));
      return false;
    }
    return true;
  }

  // A lost connection or a refused CURVE handshake drops the peer.
  void drain_monitor(size_t i) {
    while (peers_[i].monitor) {
      const auto e = next_monitor_event(*peers_[i].monitor);
      if (!e) break;
      if (e->id == ZMQ_EVENT_DISCONNECTED) drop(i, drop_kind::io, "connection lost");
      if (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        drop(i, drop_kind::io, "it refused this node's CURVE key");
      if (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
        drop(i, drop_kind::io, "the CURVE handshake failed (its key is not the one the coordinator named)");
    }
  }

  void receive(size_t i) {
    std::vector<zmq::message_t> parts;
    size_t n_parts = 0;
    for (int budget = 0; budget < 64 && peers_[i].phase != peer_phase::dropped; ++budget) {
      try {
        if (!recv_message(*peers_[i].sock, parts, n_parts)) return;
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) return;
        drop(i, drop_kind::io, fmt::format("receive failed: {}", e.what()));
        return;
      }
      handle(i, parts, n_parts);
    }
  }

  void handle(size_t i, std::vector<zmq::message_t>& parts, size_t n_parts) {
    auto& p = peers_[i];
    state_reply r;
    if (n_parts > 2) return drop(i, drop_kind::malformed, fmt::format("sent a reply of {} frames", n_parts));
    if (auto bad = parse_reply(parts[0].data(), parts[0].size(), r))
      return drop(i, drop_kind::malformed, "sent garbage: " + *bad);
    if (r.cluster_id != cluster_id_)
      return drop(i, drop_kind::wrong_cluster,
                  fmt::format("serves cluster {}, not {}{}", r.cluster_id, cluster_id_,
                              r.message.empty() ? "" : " (" + r.message + ")"));
    const bool is_chunk = r.status == state_status::chunk;
    if ((n_parts == 2) != is_chunk)
      return drop(i, drop_kind::malformed, fmt::format("sent a reply of {} frames", n_parts));
    switch (r.status) {
      case state_status::offer:
        if (p.phase != peer_phase::asking) return;  // a duplicate: nothing new
        for (auto& o : r.offers)
          if (o.total > opts_.max_bytes)
            return drop(i, drop_kind::malformed,
                        fmt::format("offers {} of {} bytes, more than fetch_options::max_bytes ({})",
                                    key_text(o.key), o.total, opts_.max_bytes));
        p.offers = std::move(r.offers);
        p.phase = peer_phase::offered;
        p.last_heard = last_progress_ = clock::now();
        if (!first_offer_) first_offer_ = p.last_heard;
        if (chosen_) consider(i);
        return;
      case state_status::chunk: return chunk(i, r, parts[1]);
      case state_status::gone:
        return drop(i, drop_kind::no_state,
                    fmt::format("no longer holds the state (it has published twice since): {}", r.message));
      case state_status::refused: return drop(i, drop_kind::wrong_cluster, "refused: " + r.message);
      case state_status::bad_request: return drop(i, drop_kind::malformed, "refused a request: " + r.message);
    }
  }

  void chunk(size_t i, const state_reply& r, const zmq::message_t& payload) {
    auto& p = peers_[i];
    const auto it = p.outstanding.find(r.request_id);
    if (it == p.outstanding.end())
      return drop(i, drop_kind::malformed,
                  fmt::format("sent a chunk for request {}, never asked of it", r.request_id));
    const size_t c = it->second;
    const uint64_t off = c * plan_.chunk_len;
    const uint64_t len = std::min<uint64_t>(plan_.chunk_len, chosen_->total - off);
    if (r.key != chosen_->key || r.offset != off || r.length != len || payload.size() != len)
      return drop(i, drop_kind::malformed,
                  fmt::format("sent chunk {} of {} at [{}, +{}) with {} bytes, asked for {} at [{}, +{})",
                              key_text(r.key), r.request_id, r.offset, r.length, payload.size(),
                              key_text(chosen_->key), off, len));
    const auto* data = static_cast<const std::byte*>(payload.data());
    if (crc32c(data, len) != r.checksum)
      return drop(i, drop_kind::malformed, fmt::format("sent chunk [{}, +{}) with a bad CRC-32C", off, len));
    const uint64_t bb = chosen_->block_bytes;
    for (uint64_t b = 0; b < len; b += bb) {
      const auto idx = static_cast<size_t>((off + b) / bb);
      if (crc32c(data + b, std::min(bb, len - b)) != chosen_->block_checksums[idx])
        return drop(i, drop_kind::malformed,
                    fmt::format("sent block {} of {} whose CRC-32C differs from the offer's (corrupt copy)",
                                idx, key_text(chosen_->key)));
    }
    p.outstanding.erase(it);
    p.last_heard = last_progress_ = clock::now();
    if (done_[c]) return;  // fetched meanwhile from a peer it was given to after a drop
    std::memcpy(buffer_.data() + off, data, len);
    done_[c] = true;
    ++n_done_;
    done_bytes_ += len;
    p.bytes += len;
    report_progress(false);
  }

  // Once every open peer has answered (or the grace after the first answer is over): the newest key, or
  // opts.want; among the offers of that key, the contents most peers agree on.
  void choose() {
    bool all = true;
    for (auto& p : peers_)
      if (p.phase == peer_phase::asking) all = false;
    if (!first_offer_ || (!all && clock::now() - *first_offer_ < offer_grace)) return;
    std::vector<const std::vector<offer_info>*> offers;
    for (const auto& p : peers_) offers.push_back(&p.offers);
    const auto key = opts_.want ? opts_.want : newest_offered(offers, opts_.fragment, opts_.min_round);
    if (!key) return;  // nobody offers anything (yet): check_nothing_offered decides
    const offer_info* best = most_agreed(offers, *key);
    if (!best) return;
    chosen_ = *best;
    plan_ = plan_chunks(*chosen_, opts_.chunk_bytes);
    buffer_.resize(chosen_->total);
    done_.assign(plan_.n_chunks, false);
    for (size_t c = 0; c < plan_.n_chunks; ++c) pending_.push_back(c);
    for (size_t i = 0; i < peers_.size(); ++i)
      if (peers_[i].phase == peer_phase::offered) consider(i);
    size_t sources = 0;
    for (const auto& p : peers_) sources += p.phase == peer_phase::source ? 1 : 0;
    window_ = request_window(opts_.in_flight, plan_, sources);
  }

  // A peer that answered: a source if it offers the chosen contents, otherwise left out with the reason.
  void consider(size_t i) {
    auto& p = peers_[i];
    for (auto& o : p.offers)
      if (o.same_contents(*chosen_)) {
        p.phase = peer_phase::source;
        p.last_heard = clock::now();
        return;
      }
    for (auto& o : p.offers)
      if (o.key == chosen_->key) {
        if (opts_.own_contents) return drop(i, drop_kind::none, "");  // its own state: as good, not chosen
        return drop(
            i, drop_kind::malformed,
            fmt::format("offers {} with other contents (CRC-32C {:08x}, {} bytes; most peers: {:08x}, {} "
                        "bytes)",
                        key_text(o.key), o.checksum, o.total, chosen_->checksum, chosen_->total));
      }
    const auto has = keys_text(p.offers);
    drop(i, drop_kind::no_state,
         fmt::format("does not offer {} (it offers {})", key_text(chosen_->key), has.empty() ? "none" : has));
  }

  void dispatch() {
    for (size_t i = 0; i < peers_.size() && !pending_.empty(); ++i) {
      auto& p = peers_[i];
      while (p.phase == peer_phase::source && p.outstanding.size() < window_ && !pending_.empty()) {
        const size_t c = pending_.front();
        if (done_[c]) {
          pending_.pop_front();
          continue;
        }
        state_request r;
        r.cluster_id = cluster_id_;
        r.chunk = true;
        r.request_id = next_request_++;
        r.key = chosen_->key;
        r.offset = c * plan_.chunk_len;
        r.length = std::min<uint64_t>(plan_.chunk_len, chosen_->total - r.offset);
        if (!send(i, r)) break;  // queue full: later
        pending_.pop_front();
        if (p.outstanding.empty()) p.last_heard = clock::now();  // its clock starts with its first request
        p.outstanding.emplace(r.request_id, c);
      }
    }
  }

  void check_stalls() {
    const auto now = clock::now();
    for (size_t i = 0; i < peers_.size(); ++i) {
      auto& p = peers_[i];
      if (p.phase == peer_phase::source && !p.outstanding.empty() && now - p.last_heard > peer_stall_)
        drop(i, drop_kind::stalled,
             fmt::format("sent nothing for {} with {} requests outstanding", control::secs(peer_stall_),
                         p.outstanding.size()));
    }
  }

  // Chunks are missing and no peer can supply them any more.
  void check_sources_left() {
    if (done()) return;
    for (auto& p : peers_)
      if (p.phase == peer_phase::source || p.phase == peer_phase::asking) return;
    fail_all_dropped(fmt::format("state transfer of {} ({}) stopped at {} of {}", key_text(chosen_->key),
                                 mib(chosen_->total), mib(done_bytes_), mib(chosen_->total)));
  }

  void check_nothing_offered() {
    for (auto& p : peers_)
      if (p.phase == peer_phase::asking) return;
    bool any_offer = false;
    for (auto& p : peers_) any_offer |= !p.offers.empty();
    fail_all_dropped(opts_.want
                         ? fmt::format("state transfer: no peer offers state {}", key_text(*opts_.want))
                     : any_offer ? std::string("state transfer: no peer offers a state")
                                 : std::string("state transfer: no peer has a state to offer"));
  }

  [[noreturn]] void fail_all_dropped(const std::string& what) { throw_all_dropped(peers_, what); }

  [[noreturn]] void fail_deadline() {
    std::string causes;
    for (auto& p : peers_) {
      const char* state = p.phase == peer_phase::asking    ? "never answered"
                          : p.phase == peer_phase::source  ? "a source, silent"
                          : p.phase == peer_phase::dropped ? "left out: its state is its own"  // own_contents
                                                           : "answered";
      causes += fmt::format("; {}: {}", p.endpoint,
                            p.phase == peer_phase::dropped && !p.cause.empty() ? p.cause : state);
    }
    throw lw_error(
        errc::deadline_missed,
        fmt::format("state transfer: no progress from any peer for {}{}{}", control::secs(opts_.timeout),
                    chosen_ ? fmt::format(" ({} of {} of {} fetched)", mib(done_bytes_), mib(chosen_->total),
                                          key_text(chosen_->key))
                            : std::string(" (no state offered)"),
                    causes));
  }

  std::string sources_text() const {
    std::vector<std::string> names;
    for (auto& p : peers_)
      if (p.phase == peer_phase::source) names.push_back(p.endpoint);
    return control::join_names(names);
  }

  void report_progress(bool final) {
    if (!opts_.progress || !chosen_) return;
    const auto now = clock::now();
    const uint64_t step = std::max<uint64_t>(chosen_->total / 10, 1);
    if (final || done_bytes_ >= next_report_bytes_ || now - last_report_ >= std::chrono::seconds(1)) {
      if (final && reported_final_) return;
      reported_final_ = final || done_bytes_ == chosen_->total;
      opts_.progress(done_bytes_, chosen_->total);
      last_report_ = now;
      next_report_bytes_ = (done_bytes_ / step + 1) * step;
    }
  }

  uint64_t cluster_id_;
  fetch_options opts_;
  std::chrono::milliseconds peer_stall_;
  zmq::context_t ctx_{1};
  std::vector<peer_conn> peers_;  // declared after ctx_: sockets close before the context
  uint64_t next_request_ = 1;
  std::optional<clock::time_point> first_offer_;
  clock::time_point last_progress_;
  std::optional<offer_info> chosen_;
  chunk_plan plan_;
  size_t n_done_ = 0, window_ = 2;
  uint64_t done_bytes_ = 0;
  std::vector<std::byte> buffer_;
  std::vector<bool> done_;
  std::deque<size_t> pending_;
  clock::time_point last_report_{};
  uint64_t next_report_bytes_ = 0;
  bool reported_final_ = false;
};

}  // namespace

fetched_state fetch_state(const std::vector<std::string>& peers, uint64_t cluster_id,
                          const fetch_options& opts) {
  try {
    fetcher f(peers, cluster_id, opts);
    return f.run();
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::io_error, fmt::format("state transfer: {}", e.what()));
  } catch (const std::bad_alloc& e) {
    throw lw_error(errc::io_error, "state transfer: " + describe(e));
  }
}

}  // namespace longwave::cluster
