#pragma once
// The collective a node's communicator averages through (c10d's Backend, gloo's Pair one level up): the
// ZeroMQ ring (comm/ring_allreduce.hpp) or NCCL (comm/nccl/nccl_collective.hpp), chosen by comm.backend.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "comm/codec.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

/// Every rank's message of an all-gather, in rank order: the same bytes on every rank.
struct gathered {
  size_t bytes = 0;                 ///< bytes of each message (the same on every rank)
  std::vector<double> weights;      ///< weights[r]: rank r's weight
  std::vector<std::byte> messages;  ///< weights.size() * bytes: rank r's message at offset r * bytes
};

/// What a rank says of itself with its calls, gathered with each all-reduce's confirmation so that every rank
/// knows every other's (diloco.adaptive_steps: each node's inner steps follow the fastest node's step time).
struct rank_note {
  float contributors = 0;  ///< workers behind this rank's contribution (0: it only relays)
  float step_seconds = 0;  ///< its measured seconds per inner step (0: not known yet)
};

/// An all-reduce weight that the elastic collective resolves at each try: 1 on the epoch's rank 0, 0 on the
/// others. A cluster's fresh theta_0 comes from one node this way, and from the next epoch's rank 0 when the
/// first died before the call completed (a fixed weight left only zeros: the call failed in every epoch).
inline constexpr double rank0_weight = -2.0;

/// One rank's handle on a weighted all-reduce across the nodes of a cluster. Calls are serialized; the
/// counters, cancel() and peer_declared_lost() may be called from any thread.
class collective {
 public:
  virtual ~collective() = default;

  /// Replaces data[0..n) (host memory) on every rank with sum_r(weight_r * data_r) / sum_r(weight_r), in
  /// place. Every rank passes the same n, round, fragment and dtype; (round, fragment) increases from call to
  /// call. weight is finite and >= 0 (the node's worker count; 0 while a joiner observes its first round).
  /// When every rank weighs 0 (client sampling whose drawn clients are all on nodes that are gone) the result
  /// is zeros and last_total_weight() is 0 on every rank: the caller decides what that means.
  /// dtype, when given, replaces the backend's configured wire dtype for this call (fp32 for parameters).
  /// Blocks the caller. Throws lw_error (deadline_missed, peer_lost, stale_round, invalid_config, cancelled,
  /// ...); after a throw data holds partial results and the next call must use a later round.
  virtual void allreduce(uint64_t round, float* data, size_t n, double weight = 1.0, uint32_t fragment = 0,
                         std::optional<wire_dtype> dtype = std::nullopt) = 0;

  /// Gathers one message of `bytes` bytes (the same count on every rank) and its weight from every rank: the
  /// transport of the sparse codec, whose top-k indices differ between ranks, so contributions cannot be
  /// summed on the way. Returns every rank's message, this rank's included, in rank order. allreduce and
  /// allgather share one (round, fragment) sequence; weights, errors and failures follow allreduce's rules,
  /// and last_total_weight() is the weights' sum afterwards. Backends without it throw invalid_config.
  virtual gathered allgather(uint64_t round, const std::byte* message, size_t bytes, double weight = 1.0,
                             uint32_t fragment = 0) {
    (void)round, (void)message, (void)bytes, (void)weight, (void)fragment;
    throw lw_error(
        errc::invalid_config,
        std::string("comm.dtype = \"sparse\" needs comm.backend = \"ring\", not \"") + backend_name() + "\"");
  }

  /// Makes the running call and every later one throw errc::cancelled: for a node that is stopping.
  virtual void cancel() = 0;
  /// The coordinator declared a node lost (`verdict` names it; empty: it is back). A call that is stalled
  /// fails with errc::peer_lost and the verdict instead of waiting out its deadline.
  virtual void peer_declared_lost(const std::string& verdict) = 0;

  /// The round of the last call that completed (0 before any).
  virtual uint64_t completed_round() const = 0;
  /// The weights of every rank summed, in the last all-reduce that completed (0: every rank weighed 0; NaN:
  /// the backend does not say). The average is over this many workers (eager's proxy step divides by it).
  virtual double last_total_weight() const { return std::numeric_limits<double>::quiet_NaN(); }
  /// The names of the ranks whose contributions the last completed call averaged, in rank order: the members
  /// of the epoch whose ring computed the result (a membership change may keep a result computed before it).
  /// Empty where the backend does not know them (one process, NCCL).
  virtual std::vector<std::string> last_members() const { return {}; }
  /// The note this rank sends with its next calls (any thread).
  virtual void set_note(const rank_note& note) { (void)note; }
  /// Every rank's note as the last completed call gathered it, in rank order; empty where the backend
  /// gathers none (NCCL, a ring without confirmations).
  virtual std::vector<rank_note> notes() const { return {}; }
  /// Bytes this rank sent and received since construction (the backend's own count or estimate).
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
  /// Seconds spent encoding to, and decoding from, the wire dtype since construction.
  virtual double encode_seconds() const = 0;
  virtual double decode_seconds() const = 0;
  /// Seconds this rank's calls waited since construction: holding a ready chunk that the next rank's queue
  /// would not take (the link to it, or it, is slow), and with nothing to send while a chunk was due from the
  /// previous rank. On a ring with one slow link, the rank before it is the one that waits to send.
  virtual double send_wait_seconds() const { return 0; }
  virtual double receive_wait_seconds() const { return 0; }
  /// Values the backend encodes together (a chunk shares its int8 scales): error feedback quantizes in
  /// pieces of this size, as the backend will. At least 1.
  virtual size_t chunk_elements() const = 0;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "ring" or "nccl": comm.backend's name for this backend, for log lines.
  virtual const char* backend_name() const = 0;
};

}  // namespace longwave::comm
