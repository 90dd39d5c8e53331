#pragma once
// Weighted ring all-reduce of a flat fp32 vector over ZeroMQ: pipelined reduce-scatter then all-gather of
// encoded chunks, every received frame validated (comm/frame.hpp), bit-identical results on every rank; and
// the ring all-gather of equal-sized byte messages (sparse top-k) over the same loop.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/codec.hpp"
#include "comm/collective.hpp"
#include "comm/curve.hpp"
#include "comm/frame.hpp"
#include "comm/transport.hpp"

namespace longwave::comm {

/// A ring's CURVE settings: this node's key pair, and who hears of a refused handshake on its listening
/// socket (from the ZAP handler's thread).
struct ring_curve {
  curve_key own;
  std::function<void(const handshake_refusal&)> on_refused;
};

struct ring_options;

/// Values per chunk of a ring with these options (chunk_bytes over the codec's bytes per value, headers
/// counted): the pieces the ring encodes together. Throws invalid_config for a dtype that is not a chunk
/// codec.
size_t elements_per_chunk(const ring_options& o);

/// Settings of a ring; every rank must use the same dtype, codec, chunk_bytes, cluster_id and epoch.
struct ring_options {
  /// Element type on the wire. Accumulation is always fp32.
  wire_dtype dtype = wire_dtype::fp32;
  /// Codec variant (e.g. the int8 codebook).
  codec_options codec{};
  /// Target payload size of one chunk (one encode call, one ZeroMQ frame). Smaller chunks pipeline more
  /// finely; larger ones cost less per frame.
  size_t chunk_bytes = size_t{1} << 20;
  /// The longest time a call may go without progress (a chunk accepted from the previous rank or handed to
  /// ZeroMQ for the next) before it throws deadline_missed. It must cover the skew between the ranks' calls.
  std::chrono::milliseconds timeout{30000};
  /// A ring link silent this long (transport_options::link_timeout) fails the call naming the next rank,
  /// long before `timeout`; 0: only `timeout`.
  std::chrono::milliseconds link_timeout{0};
  /// Frames carrying another cluster id are rejected (wrong_cluster).
  uint64_t cluster_id = 0;
  /// Membership epoch this ring's members belong to: written into every frame sent; frames of another epoch
  /// are rejected (wrong_epoch), never held. A node builds a new ring when the epoch changes.
  uint64_t epoch = 0;
  /// ZeroMQ high-water marks, in chunks, towards the next rank and from each incoming connection.
  int send_hwm = 64;
  int recv_hwm = 64;
  /// Frames of a later round that arrive during a round are kept for it, up to this many.
  size_t max_held_frames = 64;
  /// Node name of every rank, for log lines (empty: ranks are named by endpoint only).
  std::vector<std::string> names;
  /// A call without progress for stall_report_after is reported to on_stall (on the I/O thread; it must not
  /// block), naming the rank, node and endpoint it waits for; then again every stall_report_every.
  std::chrono::milliseconds stall_report_after{10000};
  std::chrono::milliseconds stall_report_every{30000};
  std::function<void(const std::string&)> on_stall;
  /// CURVE: this node's keys, and every rank's public key (indexed like the endpoints): the next rank's is
  /// pinned, and the listening socket admits the previous rank's only. Unset: plain TCP.
  std::optional<ring_curve> curve;
  std::vector<std::string> public_keys;
  /// Builds the links (comm/transport.hpp): empty means ZeroMQ; tests use the in-process hub, and faults
  /// or a rate limit wrap either (comm/fault_transport.hpp).
  transport_factory transport;
};

/// One member of a ring of world ranks, the "ring" comm.backend. Owns a transport (one I/O thread, all
/// the links); allreduce runs on that thread while the caller waits. Not copyable; calls are serialized.
struct ring_plan;

class ring_allreduce final : public collective {
 public:
  /// Called on the I/O thread for each dropped frame with the sending address (and the rank it claims, if
  /// any) and "<reject_reason>: <detail>". Must not block or call back into the ring.
  using reject_callback = std::function<void(const std::string& peer, const std::string& reason)>;

  /// rank in [0, world); endpoints[r] is rank r's bind endpoint, e.g. "tcp://127.0.0.1:5601". This rank
  /// binds endpoints[rank] and connects to endpoints[(rank + 1) % world]; the next rank may start later.
  /// Throws lw_error(errc::invalid_config) for bad arguments and lw_error(errc::io_error) if the endpoint
  /// cannot be bound. Without on_reject, rejections are logged to stderr (the first 32).
  ring_allreduce(int rank, std::vector<std::string> endpoints, ring_options opts,
                 reject_callback on_reject = {});

  /// Stops the I/O thread after the running call, then closes the sockets: frames still queued for the next
  /// rank get up to `timeout` to leave after a successful call; after a failed call or cancel() they are
  /// dropped, so destruction is quick and a new ring may bind the same endpoint at once.
  ~ring_allreduce() override;

  ring_allreduce(const ring_allreduce&) = delete;
  ring_allreduce& operator=(const ring_allreduce&) = delete;

  /// Replaces data[0..n) on every rank with sum_r(weight_r * data_r) / sum_r(weight_r), in place, the same
  /// bits on every rank (each segment's owner encodes it once and everyone, the owner included, decodes those
  /// bytes). Every rank must pass the same n, round and fragment; (round, fragment) must increase from call
  /// to call (lexicographically) and frames of older ones are rejected as wrong_round. weight must be
  /// finite and >= 0 (e.g. the rank's local worker count; 0: contributes nothing), and some rank's positive.
  /// With one rank the result is decode(encode(data)). Blocks the caller.
  ///
  /// Throws lw_error with errc::deadline_missed (no progress for `timeout`; the message names what was
  /// awaited and the last rejection), errc::peer_lost (the connection to the next rank dropped while chunks
  /// were still to be sent), errc::stale_round (round not after the previous call's), errc::invalid_config
  /// (bad weight), errc::malformed_frame (this rank's own segment cannot be encoded, e.g. int8 and
  /// non-finite values), errc::io_error (ZeroMQ failure) or errc::cancelled (destructor running). After a
  /// throw, data[0..n) holds partial sums; retry with a later round on every rank.
  ///
  /// dtype, when given, replaces ring_options::dtype for this call (e.g. fp32 for parameters that must reach
  /// every rank unrounded on an int8 ring); every rank must pass the same, or the frames are rejected as
  /// bad_dtype and the call misses its deadline.
  void allreduce(uint64_t round, float* data, size_t n, double weight = 1.0, uint32_t fragment = 0,
                 std::optional<wire_dtype> dtype = std::nullopt) override;

  /// Gathers every rank's message of `bytes` bytes (segment r is rank r's) in a pipelined ring: step t sends
  /// segment r-t, this rank's own at step 0 and then the bytes received at step t-1 unchanged (same payload
  /// and CRC), in chunks of about chunk_bytes, as dtype sparse frames. For messages that cannot be summed on
  /// the way (sparse top-k indices differ per rank); the caller decodes and sums them in rank order, so
  /// every rank gets the same bits. Preconditions, errors and the shared (round, fragment) sequence are
  /// allreduce's; some rank's weight must be positive. Blocks the caller.
  gathered allgather(uint64_t round, const std::byte* message, size_t bytes, double weight = 1.0,
                     uint32_t fragment = 0) override;

  /// Makes the running call (within about 50 ms) and every later one throw errc::cancelled: for a node that
  /// is stopping. Any thread.
  void cancel() override;

  /// The coordinator declared a node lost (`verdict` names it). A call that has had no progress for
  /// stall_report_after, now or later, throws errc::peer_lost with the verdict instead of waiting out
  /// `timeout`. A call that completes withdraws it (every rank took part), and so does an empty verdict (the
  /// node is back). Any thread.
  void peer_declared_lost(const std::string& verdict) override;

  /// The round of the last call that completed (0 before any). Any thread.
  uint64_t completed_round() const override;
  double last_total_weight() const override;
  /// Frames dropped by validation since construction.
  uint64_t rejected_frames() const;
  /// Bytes of all frames handed to ZeroMQ for the next rank.
  uint64_t bytes_sent() const override;
  /// Bytes of all frames read from the listening socket, rejected ones included.
  uint64_t bytes_received() const override;
  /// Seconds spent encoding chunks, and decoding (or decode-accumulating) received ones, since construction.
  double encode_seconds() const override;
  double decode_seconds() const override;
  double send_wait_seconds() const override;
  double receive_wait_seconds() const override;

  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(endpoints_.size()); }
  const char* backend_name() const override { return "ring"; }
  /// Values per chunk (chunk_bytes / encoded bytes per value, at least 1).
  size_t chunk_elements() const override { return chunk_elements_; }

 private:
  struct held_frame;
  struct round_ops;
  class round_run;  // one call's event loop (ring_round.cpp)

  // The checks every call makes before it starts (stale key, weight); under call_mu_.
  void check_call(uint64_t round, uint32_t fragment, double weight) const;
  // Claims (round, fragment) and runs body on the I/O thread (here with one rank), rethrowing its error.
  void run_call(uint64_t round, uint32_t fragment, const std::function<void()>& body);
  // The all-reduce's and the all-gather's arithmetic around run_round (I/O thread).
  void reduce_round(uint64_t round, uint32_t fragment, float* data, size_t n, double weight,
                    const ring_options& o, size_t chunk_elements);
  void gather_round(uint64_t round, uint32_t fragment, const std::byte* message, double weight, gathered& g);
  // The event loop that runs a plan's frames: one for both collectives.
  void run_round(uint64_t round, uint32_t fragment, const ring_plan& plan, wire_dtype dtype,
                 uint64_t total_elements, const ring_options& o, const round_ops& ops);
  void single_rank(float* data, size_t n, const ring_options& o, size_t chunk_elements);
  void report(const std::string& peer, const rejection& r);
  std::string rank_text(uint32_t r) const;
  std::optional<std::string> verdict() const;

  int rank_;
  std::vector<std::string> endpoints_;
  ring_options opts_;
  reject_callback on_reject_;
  size_t chunk_elements_ = 1;

  std::mutex call_mu_;                                 // serializes allreduce and allgather calls
  std::optional<std::pair<uint64_t, uint32_t>> last_;  // (round, fragment) of the last call; under call_mu_
  bool failed_ = false;                                // the last call threw; under call_mu_

  std::unique_ptr<std::deque<held_frame>> held_;  // later-round frames kept for their round (I/O thread)
  struct counters;
  std::unique_ptr<counters> counters_;
  std::unique_ptr<transport> transport_;  // last: destroyed first, joining the I/O thread
};

}  // namespace longwave::comm
