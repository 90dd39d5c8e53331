#pragma once
// The state fetcher's peers and its choices among what they offer (cluster/state_fetcher.cpp): which key,
// which contents, how the download is cut into chunks and request windows, and the account of a failure.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "cluster/state_frames.hpp"

namespace longwave::cluster {

/// Where a peer of the fetch stands.
enum class peer_phase {
  asking,   // offer requested, no answer yet
  offered,  // answered; not (yet) a source
  source,   // offers the chosen state: chunks are requested from it
  dropped,  // failed or left out; its socket is closed
};

enum class drop_kind { none, io, malformed, wrong_cluster, stalled, no_state };

/// A peer of the fetch: its socket, what it offers, the chunks it owes, and why it was dropped.
struct peer_conn {
  std::string endpoint;
  std::unique_ptr<zmq::socket_t> sock, monitor;
  peer_phase phase = peer_phase::asking;
  std::vector<offer_info> offers;
  std::map<uint64_t, size_t> outstanding;  // request id -> chunk index
  std::chrono::steady_clock::time_point last_heard;
  uint64_t bytes = 0;
  drop_kind why = drop_kind::none;
  std::string cause;
};

/// "(round 1, fragment 0), (round 2, fragment 0)"; "" for none.
std::string keys_text(const std::vector<offer_info>& offers);

/// Throws lw_error: `what`, then each peer's cause (or what it offers); errc::invalid_config when every peer
/// serves another cluster, malformed_frame when every peer sent garbage, else peer_lost.
[[noreturn]] void throw_all_dropped(const std::vector<peer_conn>& peers, const std::string& what);

/// Each peer's offers (a pointer per peer, so that the fetcher's lists are not copied).
using offers_by_peer = std::vector<const std::vector<offer_info>*>;

/// The newest key any peer offers, of `fragment` when set and of round min_round or later; nullopt: none.
std::optional<reduce_key> newest_offered(const offers_by_peer& offers, std::optional<uint32_t> fragment,
                                         uint64_t min_round);

/// Among the offers of `key`, the contents (size and checksums) the most peers offer; the first such on a
/// tie; nullptr when nobody offers `key`.
const offer_info* most_agreed(const offers_by_peer& offers, const reduce_key& key);

/// A download cut into chunks: each chunk_len bytes (the last shorter), a whole number of the offer's blocks.
struct chunk_plan {
  uint64_t chunk_len = 0;
  size_t n_chunks = 0;
};

/// Chunks of want_bytes rounded up to whole blocks, at most max_state_chunk_bytes.
chunk_plan plan_chunks(const offer_info& o, uint64_t want_bytes);

/// Requests in flight per source: in_flight when set; else enough to fill a long link (16 MiB), but no more
/// than a fair share of the chunks (a state smaller than the window still comes from every source), at
/// least 2.
size_t request_window(size_t in_flight, const chunk_plan& plan, size_t sources);

}  // namespace longwave::cluster
