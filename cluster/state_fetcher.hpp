#pragma once
// The joiner's side of state transfer: downloads the live training state from several members at once
// (cluster/state_server.hpp serves it). Wire: cluster/state_frames.hpp.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cluster/state_frames.hpp"
#include "comm/curve.hpp"

namespace longwave::cluster {

using comm::curve_key;

struct fetch_options {
  std::chrono::milliseconds timeout{30000};  ///< no progress from any peer this long: give up
  size_t chunk_bytes = 1 << 20;              ///< rounded up to a multiple of the offer's block size
  std::optional<reduce_key> want;            ///< this key only (else the newest key any peer offers)
  std::optional<uint32_t> fragment;          ///< without want: the newest key with this fragment
  uint64_t min_round = 0;                    ///< without want: only keys of this round or later
  /// About every 10 % or every second: bytes verified so far, and the state's size.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
  /// About every second while the fetch runs, progress or not (a joiner's heartbeats go on while a dead
  /// peer stalls it); it may throw to abandon the fetch.
  std::function<void()> tick;
  /// Requests in flight per peer; 0: enough for 16 MiB (at least 2), so that one peer can fill a long link.
  size_t in_flight = 0;
  /// A peer that owes replies and sends nothing this long is dropped and its chunks go to the others
  /// (a peer whose connection drops is dropped at once). 0: timeout / 3, at least 1 s.
  std::chrono::milliseconds peer_stall{0};
  /// Each peer's state is its own (diloco.outer = "eager": the nodes' thetas differ by design): the chosen
  /// key comes from the peer whose offer was chosen alone, and the others' other contents are no fault (no
  /// "dropped" cause, no warning).
  bool own_contents = false;
  /// A peer offering a larger state is dropped (malformed): the joiner allocates the whole state up front.
  uint64_t max_bytes = 256ull << 30;
  /// CURVE: this node's key pair, and each peer's public key (indexed like the peers; pinned).
  std::optional<curve_key> curve;
  std::vector<std::string> peer_keys;
};

struct fetched_state {
  reduce_key key;
  uint64_t round = 0;
  std::vector<std::byte> bytes;
  double seconds = 0;
  std::vector<uint64_t> bytes_per_peer;  ///< verified bytes each peer sent; index = peers' order
  std::vector<std::string> dropped;      ///< "peer: cause" for each peer left out or dropped
};

/// Asks each peer what it offers; takes the newest key (or opts.want) and downloads its chunks from every
/// peer that offers that key with the same checksums, in parallel (several chunks in flight per peer);
/// checks every chunk against its CRC-32C and the offer's block checksums, and the whole blob's CRC-32C;
/// a peer that fails, stalls or sends a bad chunk is dropped and its chunks are fetched from the others.
/// Throws lw_error naming the peers and causes: errc::peer_lost (no peer offers a state / all dropped),
/// errc::deadline_missed (no progress for opts.timeout), errc::malformed_frame (every peer sent garbage),
/// errc::invalid_config (every peer serves another cluster).
fetched_state fetch_state(const std::vector<std::string>& peers, uint64_t cluster_id,
                          const fetch_options& opts = {});

}  // namespace longwave::cluster
