#pragma once
// federated.clients_per_round: which clients (global worker ranks) train in a round. Every node draws alike
// from (seed, round), so no message carries the draw.
#include <cstdint>
#include <vector>

namespace longwave::actors {

/// `per_round` distinct clients of [0, clients), sorted, drawn uniformly from (seed, round) by a partial
/// Fisher-Yates shuffle. per_round <= 0 or >= clients: every client.
std::vector<int64_t> draw_clients(uint64_t seed, uint64_t round, int64_t clients, int64_t per_round);

}  // namespace longwave::actors
