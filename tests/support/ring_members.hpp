#pragma once
// Test helpers for rings whose members are threads of the test process: their options, members on free
// loopback ports, an epoch's view of some of them, and polling for a value with a deadline.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "comm/elastic_ring.hpp"
#include "tests/support/process.hpp"

namespace longwave::test {

/// Options of a test ring: a 20 s timeout and 4 KiB chunks (several per segment, so the steps pipeline).
inline comm::ring_options ring_test_options(uint64_t cluster_id) {
  comm::ring_options o;
  o.timeout = std::chrono::milliseconds(20000);
  o.cluster_id = cluster_id;
  o.chunk_bytes = 4096;
  return o;
}

/// Node names "n0", "n1", ... and their ring endpoints on 127.0.0.1.
struct ring_members {
  std::vector<std::string> names, endpoints;
};

inline ring_members make_members(size_t n) {
  ring_members m;
  for (size_t i = 0; i < n; ++i) {
    m.names.push_back("n" + std::to_string(i));
    m.endpoints.push_back("tcp://127.0.0.1:" + std::to_string(free_port()));
  }
  return m;
}

/// Members `keep` of m, in order, as epoch `epoch`'s view for the member at position `rank` of keep.
inline comm::epoch_view view_of(const ring_members& m, const std::vector<size_t>& keep, uint64_t epoch,
                                uint32_t rank) {
  comm::epoch_view v;
  v.epoch = epoch;
  v.rank = rank;
  for (auto i : keep) {
    v.names.push_back(m.names[i]);
    v.endpoints.push_back(m.endpoints[i]);
  }
  return v;
}

/// Polls until f() has a value (or 60 s pass).
template <class F>
auto poll(F f) -> decltype(f()) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    auto v = f();
    if (v || std::chrono::steady_clock::now() > deadline) return v;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace longwave::test
