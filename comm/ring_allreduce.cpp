// Ring all-reduce and all-gather: the chunk schedule of both phases, the event loop that runs it on the
// transport's I/O thread (send as soon as a chunk is ready, receive and reduce as frames arrive), and frame
// rejection.
//
// Ranks r = 0..N-1, prev = r-1, next = r+1 (mod N). The vector is cut into N segments (the first n % N one
// value longer), each segment into chunks of chunk_elements() values; an empty segment is one empty chunk.
// Reduce-scatter step t: r sends segment r-t and receives segment r-t-1, adding it to its own values
// (pre-multiplied by its weight). After N-1 steps r holds the full sum of segment r+1: it divides by the
// total weight, encodes it once, replaces its values with the decoding of those bytes, and starts the
// all-gather. All-gather step t: r sends segment r+1-t and receives segment r-t, decodes it, and forwards
// the same bytes (unless t = N-2). Chunk k of a step depends only on chunk k of the previous step, so the
// steps overlap chunk by chunk; frames between a pair of ranks keep their order (one ZeroMQ connection).
//
// allgather runs the all-gather phase alone on byte messages: segment s is rank s's message, step t sends
// segment r-t (its own first) and receives r-t-1; the same loop runs both plans (round_ops differ).
#include "comm/ring_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

using runtime::crc32c;
namespace {

constexpr size_t npos = std::numeric_limits<size_t>::max();
// Messages taken from the socket before the loop turns back to sending, so neither side starves.
constexpr int recv_batch = 16;
constexpr int max_logged_rejections = 32;

using clock = std::chrono::steady_clock;

// One chunk of the schedule, as sent or as expected.
struct item {
  ring_phase phase;
  uint32_t step;
  uint32_t segment;
  uint32_t chunk;
  size_t offset;         // into data (all-reduce) or into the segment's message (all-gather)
  size_t count;          // values (all-gather: bytes)
  size_t bytes;          // encoded payload bytes (0 for an empty chunk)
  size_t dep = npos;     // out items: the in item whose arrival makes this one ready; npos: ready at once
  bool keep = false;     // in items: the payload is passed on unchanged by a later out item
  bool forward = false;  // out items: sends the kept payload of its dep instead of building one
};

size_t payload_bytes(const ring_options& o, size_t count) {
  return count == 0 ? 0 : encoded_size(o.dtype, count, o.codec);
}

/// Adds the time from construction to destruction to a nanosecond counter (codec time for the metrics).
class codec_clock {
 public:
  explicit codec_clock(std::atomic<uint64_t>& ns) : ns_(ns), t0_(std::chrono::steady_clock::now()) {}
  ~codec_clock() {
    ns_.fetch_add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
            .count()));
  }
  codec_clock(const codec_clock&) = delete;
  codec_clock& operator=(const codec_clock&) = delete;

 private:
  std::atomic<uint64_t>& ns_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

/// Values per chunk from the codec's size for a large chunk, so headers (int8 scale, codebook) count too.
size_t elements_per_chunk(const ring_options& o) {
  constexpr size_t probe = size_t{1} << 20;
  const size_t probe_bytes = encoded_size(o.dtype, probe, o.codec);
  if (probe_bytes == std::numeric_limits<size_t>::max())
    throw lw_error(errc::invalid_config,
                   fmt::format("comm: unknown wire dtype {}", static_cast<unsigned>(o.dtype)));
  return std::max<size_t>(
      1, static_cast<size_t>(static_cast<double>(o.chunk_bytes) * probe / static_cast<double>(probe_bytes)));
}

struct ring_allreduce::counters {
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> encode_ns{0};
  std::atomic<uint64_t> decode_ns{0};
  std::atomic<uint64_t> send_wait_ns{0};  // in wait() with a chunk the next rank's queue would not take
  std::atomic<uint64_t> recv_wait_ns{0};  // in wait() for the previous rank's next chunk
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> completed_round{0};
  std::atomic<double> total_weight{0};  // of the last call: every rank's weight summed
  int logged = 0;                       // I/O thread
  mutable std::mutex verdict_mu;
  std::optional<std::string> verdict;  // from peer_declared_lost; under verdict_mu
};

struct ring_allreduce::held_frame {
  chunk_header header;
  zmq::message_t payload;
  std::string peer;
};

// The schedule of one call: what this rank sends (out) and expects (in), in wire order.
struct ring_allreduce::round_plan {
  std::vector<item> in;
  std::vector<item> out;

  // The all-reduce of n values: N segments, reduce-scatter then all-gather.
  static round_plan reduce(uint32_t rank, uint32_t world, size_t n, size_t chunk_elems,
                           const ring_options& o) {
    round_plan p;
    const size_t base = n / world;
    const size_t rem = n % world;
    auto seg_offset = [&](uint32_t s) { return s * base + std::min<size_t>(s, rem); };
    auto seg_len = [&](uint32_t s) { return base + (s < rem ? 1 : 0); };
    auto bytes_of = [&](size_t count) { return payload_bytes(o, count); };
    const int64_t r = rank;
    // in_start[p][t]: index of the first in item of (phase p, step t).
    std::vector<size_t> in_start[2];
    for (int ph = 0; ph < 2; ++ph) {
      const auto phase = static_cast<ring_phase>(ph);
      for (uint32_t t = 0; t + 1 < world; ++t) {
        const uint32_t in_seg = ph == 0 ? mod(r - t - 1, world) : mod(r - t, world);
        const uint32_t out_seg = ph == 0 ? mod(r - t, world) : mod(r + 1 - t, world);
        in_start[ph].push_back(p.in.size());
        add(p.in, phase, t, in_seg, seg_offset(in_seg), seg_len(in_seg), chunk_elems, bytes_of);
        const size_t first_out = p.out.size();
        add(p.out, phase, t, out_seg, seg_offset(out_seg), seg_len(out_seg), chunk_elems, bytes_of);
        // Dependencies: the same segment's chunk k one step earlier (the reduce-scatter's last step for the
        // all-gather's first).
        if (ph == 0 && t == 0) continue;
        p.link(first_out,
               ph == 0 ? in_start[0][t - 1] : (t == 0 ? in_start[0][world - 2] : in_start[1][t - 1]));
      }
    }
    p.mark_forwarding(world);
    return p;
  }

  // The all-gather of one message of `bytes` bytes per rank: segment s is rank s's message. Step t sends
  // segment r-t (this rank's own at step 0, then what arrived at step t-1) and receives segment r-t-1.
  static round_plan gather(uint32_t rank, uint32_t world, size_t bytes, size_t chunk_bytes) {
    round_plan p;
    auto bytes_of = [](size_t count) { return count; };
    const int64_t r = rank;
    size_t prev_in = 0;  // the first in item of step t-1
    for (uint32_t t = 0; t + 1 < world; ++t) {
      const size_t in_start = p.in.size();
      add(p.in, ring_phase::all_gather, t, mod(r - t - 1, world), 0, bytes, chunk_bytes, bytes_of);
      const size_t first_out = p.out.size();
      add(p.out, ring_phase::all_gather, t, mod(r - t, world), 0, bytes, chunk_bytes, bytes_of);
      if (t > 0) p.link(first_out, prev_in);
      prev_in = in_start;
    }
    p.mark_forwarding(world);
    return p;
  }

 private:
  static uint32_t mod(int64_t v, uint32_t world) {
    return static_cast<uint32_t>(((v % world) + world) % world);
  }

  // Appends the chunks of segment seg (len values from offset off) to v; an empty segment is one empty chunk.
  template <class BytesOf>
  static void add(std::vector<item>& v, ring_phase p, uint32_t t, uint32_t seg, size_t off, size_t len,
                  size_t chunk, BytesOf&& bytes_of) {
    const size_t k_max = len == 0 ? size_t{1} : (len + chunk - 1) / chunk;
    for (size_t k = 0; k < k_max; ++k) {
      const size_t at = std::min(len, k * chunk);
      const size_t cnt = std::min(len - at, chunk);
      v.push_back(item{p, t, seg, static_cast<uint32_t>(k), off + at, cnt, bytes_of(cnt)});
    }
  }

  // The out items from first_out on depend, chunk by chunk, on the in items from dep_start on.
  void link(size_t first_out, size_t dep_start) {
    for (size_t i = first_out; i < out.size(); ++i) out[i].dep = dep_start + (i - first_out);
  }

  // The all-gather forwards what it receives unchanged, except at its last step (nobody needs it then).
  void mark_forwarding(uint32_t world) {
    for (auto& it : in) it.keep = it.phase == ring_phase::all_gather && it.step + 2 < world;
    for (auto& it : out) it.forward = it.phase == ring_phase::all_gather && it.step > 0;
  }
};

// What a call does with its plan's payloads; run_round's loop does the rest (validation, sending, holding,
// forwarding, deadlines), the same for the all-reduce and the all-gather.
struct ring_allreduce::round_ops {
  // Takes the payload of in item i, already validated against the plan (decode, reduce or copy it); a
  // rejection drops the frame instead.
  std::function<std::optional<rejection>(size_t i, const chunk_header& h, const zmq::message_t& payload)>
      take;
  // Builds the payload of out item i, which forwards nothing, and sets h's weight and checksum.
  std::function<void(size_t i, chunk_header& h, zmq::message_t& payload)> make;
};

ring_allreduce::ring_allreduce(int rank, std::vector<std::string> endpoints, ring_options opts,
                               reject_callback on_reject)
    : rank_(rank),
      endpoints_(std::move(endpoints)),
      opts_(opts),
      on_reject_(std::move(on_reject)),
      held_(std::make_unique<std::deque<held_frame>>()),
      counters_(std::make_unique<counters>()) {
  const size_t world = endpoints_.size();
  if (world == 0 || world > 65536)
    throw lw_error(errc::invalid_config, fmt::format("comm: a ring needs 1..65536 endpoints, got {}", world));
  if (rank_ < 0 || static_cast<size_t>(rank_) >= world)
    throw lw_error(errc::invalid_config,
                   fmt::format("comm: rank {} is outside the ring of {}", rank_, world));
  for (size_t r = 0; r < world; ++r) {
    if (endpoints_[r].empty())
      throw lw_error(errc::invalid_config, fmt::format("comm: endpoint of rank {} is empty", r));
    for (size_t q = 0; q < r; ++q)
      if (endpoints_[q] == endpoints_[r])
        throw lw_error(errc::invalid_config,
                       fmt::format("comm: ranks {} and {} have the same endpoint {}", q, r, endpoints_[r]));
  }
  if (!opts_.names.empty() && opts_.names.size() != world)
    throw lw_error(errc::invalid_config,
                   fmt::format("comm: {} rank names for a ring of {}", opts_.names.size(), world));
  if (opts_.chunk_bytes == 0) throw lw_error(errc::invalid_config, "comm: chunk_bytes must be positive");
  if (opts_.timeout.count() <= 0) throw lw_error(errc::invalid_config, "comm: timeout must be positive");
  if (opts_.send_hwm < 1 || opts_.recv_hwm < 1)
    throw lw_error(errc::invalid_config, "comm: high-water marks must be at least 1");
  chunk_elements_ = elements_per_chunk(opts_);
  if (world == 1) return;

  transport_options t;
  t.bind_endpoint = endpoints_[rank_];
  t.connect_endpoint = endpoints_[(rank_ + 1) % world];
  t.send_hwm = opts_.send_hwm;
  t.recv_hwm = opts_.recv_hwm;
  // Headroom over our own largest frame, so a peer with a slightly different chunk size gets a clear
  // bad_size rejection rather than a silent disconnect.
  const size_t largest =
      std::max(encoded_size(opts_.dtype, chunk_elements_, opts_.codec), max_chunk_header_bytes);
  t.max_frame_bytes =
      static_cast<int64_t>(std::min<size_t>(2 * largest + 65536, std::numeric_limits<int64_t>::max()));
  t.linger = opts_.timeout;
  if (opts_.curve) {
    if (opts_.public_keys.size() != world)
      throw lw_error(errc::invalid_config,
                     fmt::format("comm: CURVE needs every rank's public key: {} for a ring of {}",
                                 opts_.public_keys.size(), world));
    t.server_public = opts_.public_keys[(rank_ + 1) % world];
    // The listening socket admits the previous rank's key only: no other key holder can pass frames off as
    // that rank's.
    const size_t prev = (static_cast<size_t>(rank_) + world - 1) % world;
    auto only_prev = std::make_shared<key_ring>();
    only_prev->allow(opts_.public_keys[prev],
                     prev < opts_.names.size() ? opts_.names[prev] : "previous rank");
    t.curve = curve_server_keys{opts_.curve->own, std::move(only_prev), opts_.curve->on_refused};
    if (!is_z85_key(t.server_public))
      throw lw_error(errc::invalid_config,
                     fmt::format("comm: rank {} has no CURVE public key", (rank_ + 1) % world));
  }
  transport_ = opts_.transport ? opts_.transport(std::move(t)) : make_zmq_transport(std::move(t));
}

ring_allreduce::~ring_allreduce() {
  // After a failure or a cancel nobody waits for the queued frames: close at once, so the endpoint can be
  // bound again by the next ring (a new epoch) right away.
  if (transport_ && (failed_ || counters_->cancelled.load(std::memory_order_acquire)))
    transport_->drop_queued_on_close();
  transport_.reset();
}

void ring_allreduce::cancel() {
  counters_->cancelled.store(true, std::memory_order_release);
}

void ring_allreduce::peer_declared_lost(const std::string& verdict) {
  std::lock_guard<std::mutex> lk(counters_->verdict_mu);
  if (verdict.empty())
    counters_->verdict.reset();
  else
    counters_->verdict = verdict;
}

std::optional<std::string> ring_allreduce::verdict() const {
  std::lock_guard<std::mutex> lk(counters_->verdict_mu);
  return counters_->verdict;
}

std::string ring_allreduce::rank_text(uint32_t r) const {
  if (r < opts_.names.size()) return fmt::format("rank {} ({}, {})", r, opts_.names[r], endpoints_[r]);
  return fmt::format("rank {} ({})", r, endpoints_[r]);
}

double ring_allreduce::last_total_weight() const {
  return counters_->total_weight.load();
}

uint64_t ring_allreduce::completed_round() const {
  return counters_->completed_round.load();
}
uint64_t ring_allreduce::rejected_frames() const {
  return counters_->rejected.load();
}
uint64_t ring_allreduce::bytes_sent() const {
  return counters_->sent.load();
}
uint64_t ring_allreduce::bytes_received() const {
  return counters_->received.load();
}
double ring_allreduce::encode_seconds() const {
  return static_cast<double>(counters_->encode_ns.load()) * 1e-9;
}
double ring_allreduce::decode_seconds() const {
  return static_cast<double>(counters_->decode_ns.load()) * 1e-9;
}
double ring_allreduce::send_wait_seconds() const {
  return static_cast<double>(counters_->send_wait_ns.load()) * 1e-9;
}
double ring_allreduce::receive_wait_seconds() const {
  return static_cast<double>(counters_->recv_wait_ns.load()) * 1e-9;
}

void ring_allreduce::check_call(uint64_t round, uint32_t fragment, double weight) const {
  const std::pair<uint64_t, uint32_t> key{round, fragment};
  if (last_ && key <= *last_)
    throw lw_error(errc::stale_round,
                   fmt::format("comm: rank {}: round {} fragment {} does not follow round {} fragment {}",
                               rank_, round, fragment, last_->first, last_->second));
  // Weight 0: this rank contributes nothing (a node that joined and has not trained a round yet).
  if (!std::isfinite(weight) || weight < 0.0)
    throw lw_error(errc::invalid_config,
                   fmt::format("comm: rank {}: weight {} must be finite and >= 0", rank_, weight));
  if (endpoints_.size() == 1 && weight == 0.0)
    throw lw_error(errc::invalid_config,
                   fmt::format("comm: rank {}: every rank of round {} contributed weight 0", rank_, round));
}

void ring_allreduce::run_call(uint64_t round, uint32_t fragment, const std::function<void()>& body) {
  last_ = std::make_pair(round, fragment);
  failed_ = true;  // until the call returns normally
  if (endpoints_.size() == 1) {
    body();
  } else {
    // The error crosses threads as a value and is thrown afresh here.
    std::optional<std::pair<errc, std::string>> error;
    auto done = transport_->submit([&] {
      try {
        body();
      } catch (const lw_error& e) {
        error.emplace(e.code(), e.what());
      } catch (const std::exception& e) {  // e.g. std::bad_alloc
        error.emplace(errc::io_error, fmt::format("comm: rank {} round {}: {}", rank_, round, e.what()));
      }
    });
    done.get();
    if (error) throw lw_error(error->first, error->second);
  }
  failed_ = false;
  counters_->completed_round.store(round);
  std::lock_guard<std::mutex> verdict_lk(counters_->verdict_mu);
  counters_->verdict.reset();
}

void ring_allreduce::allreduce(uint64_t round, float* data, size_t n, double weight, uint32_t fragment,
                               std::optional<wire_dtype> dtype) {
  std::lock_guard<std::mutex> lk(call_mu_);
  ring_options o = opts_;
  if (dtype) o.dtype = *dtype;
  // A different dtype gets its own chunk length, so its frames stay about chunk_bytes long.
  const size_t chunk_elements = o.dtype == opts_.dtype ? chunk_elements_ : elements_per_chunk(o);
  LW_ASSERT(data != nullptr || n == 0, "ring_allreduce::allreduce: data is null");
  check_call(round, fragment, weight);
  if (n / endpoints_.size() / chunk_elements >= std::numeric_limits<uint32_t>::max())
    throw lw_error(
        errc::invalid_config,
        fmt::format("comm: {} values make more than 2^32 chunks per segment; raise chunk_bytes", n));
  run_call(round, fragment, [&] {
    if (endpoints_.size() == 1) {
      counters_->total_weight.store(weight);
      single_rank(data, n, o, chunk_elements);
    } else {
      reduce_round(round, fragment, data, n, weight, o, chunk_elements);
    }
  });
}

gathered ring_allreduce::allgather(uint64_t round, const std::byte* message, size_t bytes, double weight,
                                   uint32_t fragment) {
  std::lock_guard<std::mutex> lk(call_mu_);
  LW_ASSERT(message != nullptr || bytes == 0, "ring_allreduce::allgather: message is null");
  check_call(round, fragment, weight);
  if (bytes / opts_.chunk_bytes >= std::numeric_limits<uint32_t>::max())
    throw lw_error(
        errc::invalid_config,
        fmt::format("comm: a message of {} bytes makes more than 2^32 chunks; raise chunk_bytes", bytes));
  const size_t world = endpoints_.size();
  gathered g;
  g.bytes = bytes;
  g.weights.assign(world, 0.0);
  g.weights[static_cast<size_t>(rank_)] = weight;
  g.messages.resize(world * bytes);
  if (bytes != 0) std::memcpy(g.messages.data() + static_cast<size_t>(rank_) * bytes, message, bytes);
  run_call(round, fragment, [&] {
    if (world > 1) gather_round(round, fragment, message, weight, g);
    // Every rank sums the same weights in the same order, so all agree on the total (and on a refusal).
    double total = 0;
    for (double w : g.weights) total += w;
    if (!(total > 0.0))
      throw lw_error(errc::invalid_config,
                     fmt::format("comm: rank {}: every rank of round {} contributed weight 0", rank_, round));
    counters_->total_weight.store(total);
  });
  return g;
}

void ring_allreduce::single_rank(float* data, size_t n, const ring_options& o, size_t chunk_elements) {
  // sum(w x) / sum(w) is x; only the codec's rounding applies, chunk by chunk as on the wire.
  if (o.dtype == wire_dtype::fp32) return;
  std::vector<std::byte> buf(payload_bytes(o, std::min(n, chunk_elements)));
  for (size_t off = 0; off < n; off += chunk_elements) {
    const size_t cnt = std::min(chunk_elements, n - off);
    const size_t bytes = payload_bytes(o, cnt);
    bool ok = false;
    {
      codec_clock timed(counters_->encode_ns);
      encode(o.dtype, data + off, cnt, buf.data(), o.codec);
      ok = decode(o.dtype, buf.data(), bytes, cnt, data + off, o.codec);
    }
    if (!ok)
      throw lw_error(errc::malformed_frame,
                     fmt::format("comm: values {}..{} cannot be encoded as {} (not finite?)", off, off + cnt,
                                 to_string(o.dtype)));
  }
}

void ring_allreduce::report(const std::string& peer, const rejection& r) {
  counters_->rejected.fetch_add(1);
  const std::string msg = r.message();
  if (on_reject_) {
    try {
      on_reject_(peer, msg);
    } catch (const std::exception& e) {  // the callback's bug must not end the round
      std::fprintf(stderr, "longwave comm: on_reject threw: %s\n", e.what());
    }
    return;
  }
  if (counters_->logged < max_logged_rejections) {
    ++counters_->logged;
    std::fprintf(
        stderr, "longwave comm: rank %d dropped a frame from %s: %s%s\n", rank_, peer.c_str(), msg.c_str(),
        counters_->logged == max_logged_rejections ? " (further rejections are counted, not logged)" : "");
  }
}

void ring_allreduce::reduce_round(uint64_t round, uint32_t fragment, float* data, size_t n, double weight,
                                  const ring_options& o, size_t chunk_elements) {
  const auto world = static_cast<uint32_t>(endpoints_.size());
  const auto rank = static_cast<uint32_t>(rank_);
  const round_plan plan = round_plan::reduce(rank, world, n, chunk_elements, o);
  if (weight != 1.0)
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(static_cast<double>(data[i]) * weight);
  std::vector<double> in_weight(plan.in.size(), 0.0);  // reduce-scatter: weight summed into each in item

  round_ops ops;
  // Reduce-scatter: add to this rank's values; all-gather: take the owner's average.
  ops.take = [&](size_t i, const chunk_header& h, const zmq::message_t& payload) -> std::optional<rejection> {
    const item& it = plan.in[i];
    const auto* src = static_cast<const std::byte*>(payload.data());
    bool decoded = true;
    if (it.count != 0) {
      codec_clock timed(counters_->decode_ns);
      decoded = it.phase == ring_phase::reduce_scatter
                    ? decode_accumulate(o.dtype, src, payload.size(), it.count, data + it.offset, o.codec)
                    : decode(o.dtype, src, payload.size(), it.count, data + it.offset, o.codec);
    }
    if (!decoded)
      return rejection{reject_reason::bad_payload, fmt::format("the {} codec refused segment {} chunk {}",
                                                               to_string(o.dtype), it.segment, it.chunk)};
    if (it.phase == ring_phase::reduce_scatter) in_weight[i] = h.weight + weight;
    return std::nullopt;
  };
  // Reduce-scatter: the partial sum so far; the all-gather's first step finalizes the segment.
  ops.make = [&](size_t i, chunk_header& h, zmq::message_t& payload) {
    const item& it = plan.out[i];
    float* x = data + it.offset;
    if (it.phase == ring_phase::reduce_scatter) {
      h.weight = it.dep == npos ? weight : in_weight[it.dep];
    } else {
      // This rank owns the segment: average, encode once, and keep exactly what the others will decode.
      h.weight = in_weight[it.dep];
      counters_->total_weight.store(h.weight);
      if (!(h.weight > 0.0))
        throw lw_error(
            errc::invalid_config,
            fmt::format("comm: rank {}: every rank of round {} contributed weight 0", rank_, round));
      const double inv = 1.0 / h.weight;
      for (size_t j = 0; j < it.count; ++j) x[j] = static_cast<float>(static_cast<double>(x[j]) * inv);
    }
    payload = zmq::message_t(it.bytes);
    auto* dst = static_cast<std::byte*>(payload.data());
    bool own_decoded = true;
    if (it.count != 0) {
      codec_clock timed(counters_->encode_ns);
      encode(o.dtype, x, it.count, dst, o.codec);
      // The owner keeps exactly what the others will decode (counted as encoding: it is the owner's).
      if (it.phase == ring_phase::all_gather)
        own_decoded = decode(o.dtype, dst, it.bytes, it.count, x, o.codec);
    }
    if (!own_decoded)
      throw lw_error(errc::malformed_frame,
                     fmt::format("comm: rank {} round {}: segment {} chunk {} cannot be encoded as {} (the "
                                 "average is not finite)",
                                 rank, round, it.segment, it.chunk, to_string(o.dtype)));
    h.checksum = crc32c(payload.data(), payload.size());
  };
  run_round(round, fragment, plan, o.dtype, n, o, ops);
}

void ring_allreduce::gather_round(uint64_t round, uint32_t fragment, const std::byte* message, double weight,
                                  gathered& g) {
  const auto world = static_cast<uint32_t>(endpoints_.size());
  const round_plan plan = round_plan::gather(static_cast<uint32_t>(rank_), world, g.bytes, opts_.chunk_bytes);
  round_ops ops;
  // A segment's bytes go to its rank's slot; its weight is the origin rank's, the same in every chunk.
  ops.take = [&](size_t i, const chunk_header& h, const zmq::message_t& payload) -> std::optional<rejection> {
    const item& it = plan.in[i];
    double& w = g.weights[it.segment];
    if (it.chunk == 0)
      w = h.weight;
    else if (h.weight != w)
      return rejection{reject_reason::malformed,
                       fmt::format("segment {} chunk {} has weight {}, its chunk 0 had {}", it.segment,
                                   it.chunk, h.weight, w)};
    if (it.count != 0)
      std::memcpy(g.messages.data() + it.segment * g.bytes + it.offset, payload.data(), it.count);
    return std::nullopt;
  };
  // Only step 0 builds a payload: this rank's own message, as it is.
  ops.make = [&](size_t i, chunk_header& h, zmq::message_t& payload) {
    const item& it = plan.out[i];
    payload = it.count == 0 ? zmq::message_t() : zmq::message_t(message + it.offset, it.count);
    h.weight = weight;
    h.checksum = crc32c(payload.data(), payload.size());
  };
  run_round(round, fragment, plan, wire_dtype::sparse, g.bytes, opts_, ops);
}

void ring_allreduce::run_round(uint64_t round, uint32_t fragment, const round_plan& plan, wire_dtype dtype,
                               uint64_t total_elements, const ring_options& o, const round_ops& ops) {
  try {
    const auto world = static_cast<uint32_t>(endpoints_.size());
    const auto rank = static_cast<uint32_t>(rank_);
    const uint32_t prev = (rank + world - 1) % world;
    const uint32_t next = (rank + 1) % world;
    transport& tr = *transport_;

    chunk_expectation expect;
    expect.cluster_id = opts_.cluster_id;
    expect.epoch = opts_.epoch;
    expect.round = round;
    expect.fragment = fragment;
    expect.world_size = world;
    expect.total_elements = total_elements;
    expect.dtype = dtype;
    expect.sender = prev;

    struct forward_entry {
      zmq::message_t payload;
      uint32_t checksum;
      double weight;
    };
    std::deque<forward_entry> forward;  // all-gather payloads received, still to pass on, in order
    size_t in_next = 0;
    size_t out_next = 0;
    uint64_t rejected_here = 0;
    std::string last_rejection;

    // Held frames of this round go first (they arrived before anything still in the socket); older ones are
    // stale, later ones stay held.
    std::deque<held_frame> replay;
    {
      std::deque<held_frame> keep;
      for (auto& f : *held_) {
        if (is_later_round(f.header, expect))
          keep.push_back(std::move(f));
        else
          replay.push_back(std::move(f));
      }
      held_->swap(keep);
    }

    auto reject = [&](const std::string& peer, const rejection& r) {
      ++rejected_here;
      last_rejection = fmt::format("{} from {}", r.message(), peer);
      report(peer, r);
    };

    // Validates a parsed chunk against the next in item and, if it fits, lets ops take it.
    auto accept = [&](const chunk_header& h, zmq::message_t& payload, const std::string& peer) -> bool {
      const item& it = plan.in[in_next];
      expect.phase = it.phase;
      expect.step = it.step;
      expect.segment = it.segment;
      expect.chunk = it.chunk;
      expect.element_count = it.count;
      expect.byte_count = it.bytes;
      auto bad = check_chunk(h, payload.data(), payload.size(), expect);
      if (!bad) bad = ops.take(in_next, h, payload);
      if (bad) {
        reject(peer, *bad);
        return false;
      }
      if (it.keep) forward.push_back(forward_entry{std::move(payload), h.checksum, h.weight});
      ++in_next;
      return true;
    };

    // A message straight from the socket: framing, header, then either held (later round) or accepted.
    auto on_message = [&](inbound_message& m) -> bool {
      counters_->received.fetch_add(m.bytes);
      const size_t n_parts = m.parts.size() + m.extra_parts;
      if (n_parts < 2) {
        reject(m.peer,
               rejection{reject_reason::truncated,
                         fmt::format("message has {} frame, a chunk needs 2 (header, payload)", n_parts)});
        return false;
      }
      if (n_parts > 2) {
        reject(m.peer,
               rejection{reject_reason::bad_size,
                         fmt::format("message has {} frames, a chunk has 2 (header, payload)", n_parts)});
        return false;
      }
      auto h = parse_chunk_header(m.parts[0].data(), m.parts[0].size());
      if (!h) {
        reject(m.peer, h.error());
        return false;
      }
      const std::string peer = fmt::format("{} (claims rank {})", m.peer, h.value().sender);
      // Only frames of this cluster and epoch are held; any other goes to check_chunk and is rejected.
      if (is_later_round(h.value(), expect)) {
        if (held_->size() >= opts_.max_held_frames) {
          reject(peer, rejection{reject_reason::wrong_round,
                                 fmt::format("round {} fragment {} is later than this one and {} frames are "
                                             "already held",
                                             h.value().round, h.value().fragment, held_->size())});
          return false;
        }
        held_->push_back(held_frame{h.value(), std::move(m.parts[1]), peer});
        return false;
      }
      return accept(h.value(), m.parts[1], peer);
    };

    // Builds the frames of out item i (which is ready): forwarded bytes as they came, else ops makes them.
    auto build = [&](size_t i, zmq::message_t& header, zmq::message_t& payload) {
      const item& it = plan.out[i];
      chunk_header h;
      h.cluster_id = opts_.cluster_id;
      h.epoch = opts_.epoch;
      h.round = round;
      h.fragment = fragment;
      h.phase = it.phase;
      h.step = it.step;
      h.segment = it.segment;
      h.chunk = it.chunk;
      h.sender = rank;
      h.world_size = world;
      h.dtype = dtype;
      h.total_elements = total_elements;
      h.element_count = it.count;
      h.byte_count = it.bytes;
      if (it.forward) {
        forward_entry f = std::move(forward.front());
        forward.pop_front();
        payload = std::move(f.payload);
        h.checksum = f.checksum;
        h.weight = f.weight;
      } else {
        ops.make(i, h, payload);
      }
      const auto bytes = build_chunk_header(h);
      header = zmq::message_t(bytes.data(), bytes.size());
    };

    auto describe_wait = [&] {
      std::string what;
      if (in_next < plan.in.size()) {
        const item& it = plan.in[in_next];
        what = fmt::format("waiting for {} step {} segment {} chunk {} from {}", to_string(it.phase), it.step,
                           it.segment, it.chunk, rank_text(prev));
      }
      if (out_next < plan.out.size()) {
        const item& it = plan.out[out_next];
        if (!what.empty()) what += "; ";
        what += fmt::format("{} {} step {} segment {} chunk {} for {}",
                            it.dep == npos || it.dep < in_next ? "unable to hand over" : "still to send",
                            to_string(it.phase), it.step, it.segment, it.chunk, rank_text(next));
      }
      if (rejected_here > 0)
        what += fmt::format("; {} frames rejected, last: {}", rejected_here, last_rejection);
      return what;
    };

    std::optional<std::pair<zmq::message_t, zmq::message_t>> pending;  // built, not yet taken by ZeroMQ
    auto deadline = clock::now() + opts_.timeout;
    auto last_progress = clock::now();
    auto next_stall_report = o.stall_report_after;  // since last_progress
    inbound_message msg;
    while (in_next < plan.in.size() || out_next < plan.out.size()) {
      if (tr.stopping() || counters_->cancelled.load(std::memory_order_acquire))
        throw lw_error(errc::cancelled,
                       fmt::format("comm: rank {} round {}: ring is shutting down", rank_, round));
      bool progress = false;
      bool blocked_send = false;
      // Send every ready chunk ZeroMQ will take.
      while (out_next < plan.out.size()) {
        const item& it = plan.out[out_next];
        if (it.dep != npos && it.dep >= in_next) break;
        if (!pending) {
          pending.emplace();
          build(out_next, pending->first, pending->second);
        }
        const size_t bytes = pending->first.size() + pending->second.size();
        if (!tr.try_send(pending->first, pending->second)) {
          blocked_send = true;
          break;
        }
        counters_->sent.fetch_add(bytes);
        pending.reset();
        ++out_next;
        progress = true;
      }
      // Then a batch of incoming frames: held ones of this round first.
      bool more_waiting = false;
      for (int b = 0; b < recv_batch && in_next < plan.in.size(); ++b) {
        if (!replay.empty()) {
          held_frame f = std::move(replay.front());
          replay.pop_front();
          if (accept(f.header, f.payload, f.peer)) progress = true;
        } else if (tr.try_recv(msg, 2)) {
          if (on_message(msg)) progress = true;
        } else {
          break;
        }
        if (b + 1 == recv_batch) more_waiting = true;
      }
      if (out_next < plan.out.size())
        if (auto lost = tr.link_lost())
          throw lw_error(errc::peer_lost,
                         fmt::format("comm: rank {} round {}: {} (rank {}) with {} chunks still to send",
                                     rank_, round, *lost, next, plan.out.size() - out_next));
      const auto now = clock::now();
      if (progress) {
        deadline = now + opts_.timeout;
        last_progress = now;
        next_stall_report = o.stall_report_after;
        continue;
      }
      // A stalled call: say what it waits for now and then, and give up early once the coordinator has
      // declared a node lost (the stall is then most likely that node's).
      const auto stalled = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_progress);
      if (o.on_stall && stalled >= next_stall_report) {
        next_stall_report += o.stall_report_every;
        const std::string line = fmt::format(
            "comm: rank {} round {}: no progress for {} s (deadline in {} s): {}", rank_, round,
            stalled.count() / 1000, std::chrono::duration_cast<std::chrono::seconds>(deadline - now).count(),
            describe_wait());
        try {
          o.on_stall(line);
        } catch (const std::exception& e) {  // the callback's bug must not end the round
          std::fprintf(stderr, "longwave comm: on_stall threw: %s\n", e.what());
        }
      }
      if (stalled >= o.stall_report_after)
        if (auto v = verdict())
          throw lw_error(errc::peer_lost,
                         fmt::format("comm: rank {} round {}: {}; no progress for {} s: {}", rank_, round, *v,
                                     stalled.count() / 1000, describe_wait()));
      if (now >= deadline)  // checked before more_waiting, so a flood of bad frames cannot hold it off
        throw lw_error(errc::deadline_missed,
                       fmt::format("comm: rank {} round {}: no progress for {} ms: {}", rank_, round,
                                   opts_.timeout.count(), describe_wait()));
      if (more_waiting) continue;
      tr.wait(blocked_send, in_next < plan.in.size(), deadline);
      // Who held this rank up: the next rank (a full queue towards it) or the previous one (nothing to send).
      const auto waited = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - now).count());
      (blocked_send ? counters_->send_wait_ns : counters_->recv_wait_ns).fetch_add(waited);
    }
    // Held frames of this round that were not needed (duplicates or forgeries) are dropped now.
    for (auto& f : replay)
      reject(
          f.peer,
          rejection{reject_reason::wrong_step,
                    fmt::format("{} step {} segment {} chunk {} arrived after the round was complete",
                                to_string(f.header.phase), f.header.step, f.header.segment, f.header.chunk)});
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::io_error,
                   fmt::format("comm: rank {} round {}: ZeroMQ error: {}", rank_, round, e.what()));
  }
}

}  // namespace longwave::comm
