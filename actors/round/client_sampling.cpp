// federated.clients_per_round: the seeded draw of a round's clients.
#include "actors/round/client_sampling.hpp"

#include <algorithm>
#include <numeric>

#include "runtime/checksum/splitmix64.hpp"

namespace longwave::actors {

std::vector<int64_t> draw_clients(uint64_t seed, uint64_t round, int64_t clients, int64_t per_round) {
  std::vector<int64_t> ids(static_cast<size_t>(std::max<int64_t>(0, clients)));
  std::iota(ids.begin(), ids.end(), 0);
  if (per_round <= 0 || per_round >= clients) return ids;
  using runtime::splitmix64;
  uint64_t state = splitmix64(splitmix64(seed ^ 0x636c69656e7473ull) ^ round);  // "clients"
  for (int64_t i = 0; i < per_round; ++i) {
    state = splitmix64(state);
    const auto left = static_cast<uint64_t>(clients - i);
    const auto j = i + static_cast<int64_t>((static_cast<unsigned __int128>(state) * left) >> 64);
    std::swap(ids[static_cast<size_t>(i)], ids[static_cast<size_t>(j)]);
  }
  ids.resize(static_cast<size_t>(per_round));
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace longwave::actors
