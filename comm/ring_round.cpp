// One call's event loop (ring_allreduce::run_round): send every chunk the next rank's queue takes as soon as
// it is ready, take a batch of incoming frames (held ones of this round first), validate each against the
// plan's next in item, and watch the link, the stall reports, the coordinator's verdict and the deadline.
// The same loop runs the all-reduce's and the all-gather's plans; round_ops does the arithmetic.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <utility>

#include "comm/ring_parts.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

namespace {

using clock = std::chrono::steady_clock;
// Messages taken from the socket before the loop turns back to sending, so neither side starves.
constexpr int recv_batch = 16;

}  // namespace

class ring_allreduce::round_run {
 public:
  round_run(ring_allreduce& ring, uint64_t round, uint32_t fragment, const ring_plan& plan, wire_dtype dtype,
            uint64_t total_elements, const ring_options& o, const round_ops& ops)
      : ring_(ring),
        tr_(*ring.transport_),
        round_(round),
        fragment_(fragment),
        plan_(plan),
        dtype_(dtype),
        total_elements_(total_elements),
        o_(o),
        ops_(ops),
        world_(static_cast<uint32_t>(ring.endpoints_.size())),
        rank_(static_cast<uint32_t>(ring.rank_)),
        prev_((rank_ + world_ - 1) % world_),
        next_((rank_ + 1) % world_) {
    expect_.cluster_id = ring.opts_.cluster_id;
    expect_.epoch = ring.opts_.epoch;
    expect_.round = round;
    expect_.fragment = fragment;
    expect_.world_size = world_;
    expect_.total_elements = total_elements;
    expect_.dtype = dtype;
    expect_.sender = prev_;
    take_held();
  }

  void run() {
    deadline_ = clock::now() + ring_.opts_.timeout;
    last_progress_ = clock::now();
    next_stall_report_ = o_.stall_report_after;  // since last_progress_
    while (in_next_ < plan_.in.size() || out_next_ < plan_.out.size()) {
      if (tr_.stopping() || ring_.counters_->cancelled.load(std::memory_order_acquire))
        throw lw_error(errc::cancelled,
                       fmt::format("comm: rank {} round {}: ring is shutting down", ring_.rank_, round_));
      bool blocked_send = false;
      bool progress = send_ready(blocked_send);
      bool more_waiting = false;
      progress |= receive_batch(more_waiting);
      check_link();
      const auto now = clock::now();
      if (progress) {
        deadline_ = now + ring_.opts_.timeout;
        last_progress_ = now;
        next_stall_report_ = o_.stall_report_after;
        continue;
      }
      check_stall(now);
      if (more_waiting) continue;
      tr_.wait(blocked_send, in_next_ < plan_.in.size(), deadline_);
      // Who held this rank up: the next rank (a full queue towards it) or the previous one (nothing to send).
      const auto waited = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - now).count());
      (blocked_send ? ring_.counters_->send_wait_ns : ring_.counters_->recv_wait_ns).fetch_add(waited);
    }
    // Held frames of this round that were not needed (duplicates or forgeries) are dropped now.
    for (auto& f : replay_)
      reject(
          f.peer,
          rejection{reject_reason::wrong_step,
                    fmt::format("{} step {} segment {} chunk {} arrived after the round was complete",
                                to_string(f.header.phase), f.header.step, f.header.segment, f.header.chunk)});
  }

 private:
  struct forward_entry {
    zmq::message_t payload;
    uint32_t checksum;
    double weight;
  };

  // Held frames of this round go first (they arrived before anything still in the socket); older ones are
  // stale, later ones stay held.
  void take_held() {
    std::deque<held_frame> keep;
    for (auto& f : *ring_.held_) {
      if (is_later_round(f.header, expect_))
        keep.push_back(std::move(f));
      else
        replay_.push_back(std::move(f));
    }
    ring_.held_->swap(keep);
  }

  void reject(const std::string& peer, const rejection& r) {
    ++rejected_here_;
    last_rejection_ = fmt::format("{} from {}", r.message(), peer);
    ring_.report(peer, r);
  }

  // Sends every ready chunk the transport takes; true when one went. blocked: the next rank's queue is full.
  bool send_ready(bool& blocked) {
    bool progress = false;
    while (out_next_ < plan_.out.size()) {
      const item& it = plan_.out[out_next_];
      if (it.dep != npos && it.dep >= in_next_) break;
      if (!pending_) {
        pending_.emplace();
        build(out_next_, pending_->first, pending_->second);
      }
      const size_t bytes = pending_->first.size() + pending_->second.size();
      if (!tr_.try_send(pending_->first, pending_->second)) {
        blocked = true;
        break;
      }
      ring_.counters_->sent.fetch_add(bytes);
      pending_.reset();
      ++out_next_;
      progress = true;
    }
    return progress;
  }

  // A batch of incoming frames, held ones of this round first; true when one was taken. more_waiting: the
  // batch ended full, so the loop comes back before it waits.
  bool receive_batch(bool& more_waiting) {
    bool progress = false;
    for (int b = 0; b < recv_batch && in_next_ < plan_.in.size(); ++b) {
      if (!replay_.empty()) {
        held_frame f = std::move(replay_.front());
        replay_.pop_front();
        progress |= accept(f.header, f.payload, f.peer);
      } else if (tr_.try_recv(msg_, 2)) {
        progress |= on_message(msg_);
      } else {
        break;
      }
      if (b + 1 == recv_batch) more_waiting = true;
    }
    return progress;
  }

  // Validates a parsed chunk against the next in item and, if it fits, lets ops take it.
  bool accept(const chunk_header& h, zmq::message_t& payload, const std::string& peer) {
    const item& it = plan_.in[in_next_];
    expect_.phase = it.phase;
    expect_.step = it.step;
    expect_.segment = it.segment;
    expect_.chunk = it.chunk;
    expect_.element_count = it.count;
    expect_.byte_count = it.bytes;
    auto bad = check_chunk(h, payload.data(), payload.size(), expect_);
    if (!bad) bad = ops_.take(in_next_, h, payload);
    if (bad) {
      reject(peer, *bad);
      return false;
    }
    if (it.keep) forward_.push_back(forward_entry{std::move(payload), h.checksum, h.weight});
    ++in_next_;
    return true;
  }

  // A message straight from the socket: framing, header, then either held (later round) or accepted.
  bool on_message(inbound_message& m) {
    ring_.counters_->received.fetch_add(m.bytes);
    const size_t n_parts = m.parts.size() + m.extra_parts;
    if (n_parts != 2) {
      reject(m.peer, rejection{n_parts < 2 ? reject_reason::truncated : reject_reason::bad_size,
                               fmt::format("message has {} frame{}, a chunk has 2 (header, payload)", n_parts,
                                           n_parts == 1 ? "" : "s")});
      return false;
    }
    auto h = parse_chunk_header(m.parts[0].data(), m.parts[0].size());
    if (!h) {
      reject(m.peer, h.error());
      return false;
    }
    const std::string peer = fmt::format("{} (claims rank {})", m.peer, h.value().sender);
    // Only frames of this cluster and epoch are held; any other goes to check_chunk and is rejected.
    if (!is_later_round(h.value(), expect_)) return accept(h.value(), m.parts[1], peer);
    auto& held = *ring_.held_;
    if (held.size() >= ring_.opts_.max_held_frames) {
      reject(peer, rejection{reject_reason::wrong_round,
                             fmt::format("round {} fragment {} is later than this one and {} frames are "
                                         "already held",
                                         h.value().round, h.value().fragment, held.size())});
      return false;
    }
    held.push_back(held_frame{h.value(), std::move(m.parts[1]), peer});
    return false;
  }

  // Builds the frames of out item i (which is ready): forwarded bytes as they came, else ops makes them.
  void build(size_t i, zmq::message_t& header, zmq::message_t& payload) {
    const item& it = plan_.out[i];
    chunk_header h;
    h.cluster_id = ring_.opts_.cluster_id;
    h.epoch = ring_.opts_.epoch;
    h.round = round_;
    h.fragment = fragment_;
    h.phase = it.phase;
    h.step = it.step;
    h.segment = it.segment;
    h.chunk = it.chunk;
    h.sender = rank_;
    h.world_size = world_;
    h.dtype = dtype_;
    h.total_elements = total_elements_;
    h.element_count = it.count;
    h.byte_count = it.bytes;
    if (it.forward) {
      forward_entry f = std::move(forward_.front());
      forward_.pop_front();
      payload = std::move(f.payload);
      h.checksum = f.checksum;
      h.weight = f.weight;
    } else {
      ops_.make(i, h, payload);
    }
    const auto bytes = build_chunk_header(h);
    header = zmq::message_t(bytes.data(), bytes.size());
  }

  // The link to the next rank dropped while chunks are still to send: that rank is lost.
  void check_link() {
    if (out_next_ >= plan_.out.size()) return;
    if (auto lost = tr_.link_lost())
      throw lw_error(errc::peer_lost,
                     fmt::format("comm: rank {} round {}: {} (rank {}) with {} chunks still to send",
                                 ring_.rank_, round_, *lost, next_, plan_.out.size() - out_next_));
  }

  // A stalled call: say what it waits for now and then, give up early once the coordinator has declared a
  // node lost (the stall is then most likely that node's), and at the deadline.
  void check_stall(clock::time_point now) {
    const auto stalled = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress_);
    if (o_.on_stall && stalled >= next_stall_report_) {
      next_stall_report_ += o_.stall_report_every;
      const std::string line = fmt::format(
          "comm: rank {} round {}: no progress for {} s (deadline in {} s): {}", ring_.rank_, round_,
          stalled.count() / 1000, std::chrono::duration_cast<std::chrono::seconds>(deadline_ - now).count(),
          describe_wait());
      try {
        o_.on_stall(line);
      } catch (const std::exception& e) {  // the callback's bug must not end the round
        std::fprintf(stderr, "longwave comm: on_stall threw: %s\n", e.what());
      }
    }
    if (stalled >= o_.stall_report_after)
      if (auto v = ring_.verdict())
        throw lw_error(errc::peer_lost,
                       fmt::format("comm: rank {} round {}: {}; no progress for {} s: {}", ring_.rank_,
                                   round_, *v, stalled.count() / 1000, describe_wait()));
    if (now >= deadline_)  // checked before more_waiting, so a flood of bad frames cannot hold it off
      throw lw_error(errc::deadline_missed,
                     fmt::format("comm: rank {} round {}: no progress for {} ms: {}", ring_.rank_, round_,
                                 ring_.opts_.timeout.count(), describe_wait()));
  }

  std::string describe_wait() const {
    std::string what;
    if (in_next_ < plan_.in.size()) {
      const item& it = plan_.in[in_next_];
      what = fmt::format("waiting for {} step {} segment {} chunk {} from {}", to_string(it.phase), it.step,
                         it.segment, it.chunk, ring_.rank_text(prev_));
    }
    if (out_next_ < plan_.out.size()) {
      const item& it = plan_.out[out_next_];
      if (!what.empty()) what += "; ";
      what += fmt::format("{} {} step {} segment {} chunk {} for {}",
                          it.dep == npos || it.dep < in_next_ ? "unable to hand over" : "still to send",
                          to_string(it.phase), it.step, it.segment, it.chunk, ring_.rank_text(next_));
    }
    if (rejected_here_ > 0)
      what += fmt::format("; {} frames rejected, last: {}", rejected_here_, last_rejection_);
    return what;
  }

  ring_allreduce& ring_;
  transport& tr_;
  const uint64_t round_;
  const uint32_t fragment_;
  const ring_plan& plan_;
  const wire_dtype dtype_;
  const uint64_t total_elements_;
  const ring_options& o_;
  const round_ops& ops_;
  const uint32_t world_, rank_, prev_, next_;

  chunk_expectation expect_;
  std::deque<held_frame> replay_;      // held frames of this round, taken first
  std::deque<forward_entry> forward_;  // all-gather payloads received, still to pass on, in order
  size_t in_next_ = 0;
  size_t out_next_ = 0;
  uint64_t rejected_here_ = 0;
  std::string last_rejection_;
  std::optional<std::pair<zmq::message_t, zmq::message_t>> pending_;  // built, not yet taken by ZeroMQ
  inbound_message msg_;
  clock::time_point deadline_, last_progress_;
  std::chrono::milliseconds next_stall_report_{0};
};

void ring_allreduce::run_round(uint64_t round, uint32_t fragment, const ring_plan& plan, wire_dtype dtype,
                               uint64_t total_elements, const ring_options& o, const round_ops& ops) {
  try {
    round_run(*this, round, fragment, plan, dtype, total_elements, o, ops).run();
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::io_error,
                   fmt::format("comm: rank {} round {}: ZeroMQ error: {}", rank_, round, e.what()));
  }
}

}  // namespace longwave::comm
