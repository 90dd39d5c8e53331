// The state fetcher's choices among offers (see state_offers.hpp).
#include "cluster/state_offers.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/errors/errors.hpp"

namespace longwave::cluster {

std::optional<reduce_key> newest_offered(const offers_by_peer& offers, std::optional<uint32_t> fragment,
                                         uint64_t min_round) {
  std::optional<reduce_key> key;
  for (const auto* list : offers)
    for (const auto& o : *list)
      if ((!fragment || o.key.fragment == *fragment) && o.key.round >= min_round && (!key || *key < o.key))
        key = o.key;
  return key;
}

const offer_info* most_agreed(const offers_by_peer& offers, const reduce_key& key) {
  const offer_info* best = nullptr;
  size_t best_votes = 0;
  for (const auto* list : offers)
    for (const auto& o : *list) {
      if (o.key != key) continue;
      size_t votes = 0;
      for (const auto* other : offers)
        votes += static_cast<size_t>(std::count_if(other->begin(), other->end(),
                                                   [&](const offer_info& x) { return x.same_contents(o); }));
      if (votes > best_votes) best = &o, best_votes = votes;
    }
  return best;
}

chunk_plan plan_chunks(const offer_info& o, uint64_t want_bytes) {
  const uint64_t bb = o.block_bytes;
  const uint64_t want_len = std::max<uint64_t>(want_bytes, 1);
  chunk_plan p;
  p.chunk_len = std::min((want_len + bb - 1) / bb * bb, max_state_chunk_bytes / bb * bb);
  p.n_chunks = static_cast<size_t>((o.total + p.chunk_len - 1) / p.chunk_len);
  return p;
}

size_t request_window(size_t in_flight, const chunk_plan& plan, size_t sources) {
  if (in_flight) return in_flight;
  sources = std::max<size_t>(sources, 1);
  const size_t share = (plan.n_chunks + sources - 1) / sources;
  return std::max<size_t>(2, std::min<size_t>((16u << 20) / plan.chunk_len, share));
}

std::string keys_text(const std::vector<offer_info>& offers) {
  std::string out;
  for (const auto& o : offers) out += (out.empty() ? "" : ", ") + key_text(o.key);
  return out;
}

void throw_all_dropped(const std::vector<peer_conn>& peers, const std::string& what) {
  bool all_malformed = true, all_cluster = true;
  std::string causes;
  for (const auto& p : peers) {
    all_malformed &= p.why == drop_kind::malformed;
    all_cluster &= p.why == drop_kind::wrong_cluster;
    std::string offered;
    if (p.why == drop_kind::none) {
      offered = keys_text(p.offers);
      offered = "offers " + (offered.empty() ? std::string("nothing") : offered);
    }
    causes += fmt::format("; {}: {}", p.endpoint, p.why == drop_kind::none ? offered : p.cause);
  }
  const errc code = all_cluster     ? errc::invalid_config
                    : all_malformed ? errc::malformed_frame
                                    : errc::peer_lost;
  throw lw_error(code, what + causes + (all_cluster ? " (start every node from the same cluster file)" : ""));
}

}  // namespace longwave::cluster
