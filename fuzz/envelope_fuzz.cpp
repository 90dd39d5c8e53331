// libFuzzer target: control envelopes (cluster::parse_envelope), as a coordinator or node reads them off the
// wire. A frame that parses must survive build_envelope and parse again.
#include <cstddef>
#include <cstdint>

#include "cluster/envelope.hpp"
#include "fuzz/fuzz_seeds.hpp"

using namespace longwave::comm;
using namespace longwave::cluster;

namespace {

constexpr uint64_t cluster_id = 0x10c1a55e5;

void write_seeds(const std::string& dir) {
  const std::vector<peer_entry> peers = {{0, "alpha", "tcp://10.0.0.1:5600"},
                                         {1, "beta", "tcp://10.0.0.2:5600"}};
  std::vector<envelope> es;
  es.push_back({cluster_id, 0xffffffffu,
                hello_msg{protocol_version(),
                          cluster_id,
                          "alpha",
                          2,
                          "tcp://10.0.0.1:5600",
                          3,
                          true,
                          4,
                          2,
                          {7, 1},
                          0xfeed,
                          "tcp://10.0.0.1:5700"}});
  es.push_back({cluster_id, 0, welcome_msg{1, 2, peers, 3, 4}});
  es.push_back({cluster_id, 0, round_start_msg{5, 1, 1000, wire_dtype::int8}});
  es.push_back({cluster_id, 1, heartbeat_msg{5, 1700000000000, 4}});
  es.push_back({cluster_id, 1, done_msg{5, 1}});
  es.push_back({cluster_id, 1, error_msg{3, "round 5: deadline missed"}});
  es.push_back({cluster_id, 1, bye_msg{"stopping"}});
  es.push_back({cluster_id, 0, fence_msg{6}});
  es.push_back({cluster_id, 1, fence_ack_msg{6, {5, 0}, true, {5, 1}, true}});
  es.push_back({cluster_id, 0, membership_msg{6, 1, peers, {2, 3}, {5, 1}}});
  es.push_back({cluster_id, 1, ring_failed_msg{6, "beta", "connection dropped"}});
  es.push_back({cluster_id, 0, leave_msg{"beta"}});
  es.push_back({cluster_id, 0, recover_msg{7, peers, "stale state", 9, 4}});
  es.push_back({cluster_id, 2, join_ready_msg{{9, 0}, 9}});
  es.push_back({cluster_id, 1, stop_msg{12}});
  es.push_back({cluster_id, 1, committed_msg{12, 0xdeadbeef}});
  es.push_back({cluster_id, 1, pin_msg{12, false}});
  es.push_back({cluster_id, 1, pin_msg{0, true}});
  es.push_back({cluster_id, 1, contribute_msg{40, 81920}});
  es.push_back({cluster_id, 0, nccl_id_msg{3, std::string(256, 'f')}});
  es.push_back({cluster_id, 0, standby_msg{"tcp://127.0.0.1:5700"}});
  es.push_back({cluster_id, 0,
                merge_msg{41, {{"alpha", 40, 81920, 1}, {"beta", 38, 163840, 2}}, {{"gamma", 30, 1, 1}}}});
  for (size_t i = 0; i < es.size(); ++i) {
    const auto bytes = build_envelope(es[i]);
    longwave::fuzz::write_seed(dir, "envelope_" + std::to_string(es[i].body.index()), bytes.data(),
                               bytes.size());
  }
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto got = parse_envelope(data, size, cluster_id);
  if (!got) {
    (void)got.error().message();
    return 0;
  }
  const auto again = build_envelope(got.value());
  const auto back = parse_envelope(again.data(), again.size(), cluster_id);
  if (!back) longwave::fuzz::fail("an envelope that parsed does not parse again after build_envelope");
  if (back.value().body.index() != got.value().body.index() || back.value().sender != got.value().sender)
    longwave::fuzz::fail("an envelope changed its kind or sender through build_envelope");
  return 0;
}
