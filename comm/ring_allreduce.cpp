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

#include "comm/ring_parts.hpp"

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

constexpr int max_logged_rejections = 32;

using clock = std::chrono::steady_clock;

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

// Decodes a received chunk into x: added to it in the reduce-scatter, replacing it in the all-gather. False
// when the codec refuses the payload.
bool take_values(const item& it, const ring_options& o, const std::byte* src, size_t size, float* x,
                 std::atomic<uint64_t>& decode_ns) {
  if (it.count == 0) return true;
  codec_clock timed(decode_ns);
  return it.phase == ring_phase::reduce_scatter ? decode_accumulate(o.dtype, src, size, it.count, x, o.codec)
                                                : decode(o.dtype, src, size, it.count, x, o.codec);
}

// This rank owns the segment: its sum divided by the total weight (every rank's weight summed); zeros when
// every rank weighed 0 (collective.hpp).
void average_owned(float* x, size_t count, double total_weight) {
  if (!(total_weight > 0.0)) {
    std::fill(x, x + count, 0.0f);
    return;
  }
  const double inv = 1.0 / total_weight;
  for (size_t j = 0; j < count; ++j) x[j] = static_cast<float>(static_cast<double>(x[j]) * inv);
}

// The arguments a ring refuses: endpoints (1..65536, none empty or repeated), names, chunk size, timeout and
// high-water marks.
void check_ring(int rank, const std::vector<std::string>& endpoints, const ring_options& o) {
  const size_t world = endpoints.size();
  if (world == 0 || world > 65536)
    throw lw_error(errc::invalid_config, fmt::format("comm: a ring needs 1..65536 endpoints, got {}", world));
  if (rank < 0 || static_cast<size_t>(rank) >= world)
    throw lw_error(errc::invalid_config, fmt::format("comm: rank {} is outside the ring of {}", rank, world));
  for (size_t r = 0; r < world; ++r) {
    if (endpoints[r].empty())
      throw lw_error(errc::invalid_config, fmt::format("comm: endpoint of rank {} is empty", r));
    for (size_t q = 0; q < r; ++q)
      if (endpoints[q] == endpoints[r])
        throw lw_error(errc::invalid_config,
                       fmt::format("comm: ranks {} and {} have the same endpoint {}", q, r, endpoints[r]));
  }
  if (!o.names.empty() && o.names.size() != world)
    throw lw_error(errc::invalid_config,
                   fmt::format("comm: {} rank names for a ring of {}", o.names.size(), world));
  if (o.chunk_bytes == 0) throw lw_error(errc::invalid_config, "comm: chunk_bytes must be positive");
  if (o.timeout.count() <= 0) throw lw_error(errc::invalid_config, "comm: timeout must be positive");
  if (o.send_hwm < 1 || o.recv_hwm < 1)
    throw lw_error(errc::invalid_config, "comm: high-water marks must be at least 1");
}

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

ring_allreduce::ring_allreduce(int rank, std::vector<std::string> endpoints, ring_options opts,
                               reject_callback on_reject)
    : rank_(rank),
      endpoints_(std::move(endpoints)),
      opts_(opts),
      on_reject_(std::move(on_reject)),
      held_(std::make_unique<std::deque<held_frame>>()),
      counters_(std::make_unique<counters>()) {
  check_ring(rank_, endpoints_, opts_);
  const size_t world = endpoints_.size();
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
  t.link_timeout = opts_.link_timeout;
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
      if (weight > 0.0)
        single_rank(data, n, o, chunk_elements);
      else
        std::fill(data, data + n, 0.0f);
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
    // Every rank sums the same weights in the same order, so all agree on the total (0 included).
    double total = 0;
    for (double w : g.weights) total += w;
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
  const ring_plan plan = ring_plan::reduce(rank, world, n, chunk_elements, o);
  if (weight != 1.0)
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(static_cast<double>(data[i]) * weight);
  std::vector<double> in_weight(plan.in.size(), 0.0);  // reduce-scatter: weight summed into each in item

  round_ops ops;
  // Reduce-scatter: add to this rank's values; all-gather: take the owner's average.
  ops.take = [&](size_t i, const chunk_header& h, const zmq::message_t& payload) -> std::optional<rejection> {
    const item& it = plan.in[i];
    const auto* src = static_cast<const std::byte*>(payload.data());
    if (!take_values(it, o, src, payload.size(), data + it.offset, counters_->decode_ns))
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
      average_owned(x, it.count, h.weight);
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
  const ring_plan plan = ring_plan::gather(static_cast<uint32_t>(rank_), world, g.bytes, opts_.chunk_bytes);
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

}  // namespace longwave::comm
