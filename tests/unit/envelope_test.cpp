// Control envelopes (cluster/envelope.hpp): every message round-trips, and oversized, foreign or corrupted
// frames are refused without an exception.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <variant>

#include "cluster/envelope.hpp"

namespace {

using namespace longwave;
using namespace longwave::cluster;
using comm::protocol_version;
using comm::reject_reason;

}  // namespace

namespace {

/// The fields of the small control messages as text, so a round trip can be compared field by field.
std::string fields_of(const decltype(envelope::body)& body) {
  using std::to_string;
  if (const auto* m = std::get_if<round_start_msg>(&body))
    return "round_start " + to_string(m->round) + " " + to_string(m->fragment) + " " +
           to_string(m->n_elements) + " " + config::to_string(m->dtype);
  if (const auto* m = std::get_if<heartbeat_msg>(&body))
    return "heartbeat " + to_string(m->round) + " " + to_string(m->unix_millis) + " " + to_string(m->epoch) +
           (m->starting ? " starting" : "");
  if (const auto* m = std::get_if<done_msg>(&body))
    return "done " + to_string(m->round) + " " + to_string(m->fragment);
  if (const auto* m = std::get_if<error_msg>(&body)) return "error " + to_string(m->code) + " " + m->message;
  if (const auto* m = std::get_if<bye_msg>(&body)) return "bye " + m->reason;
  if (const auto* m = std::get_if<stop_msg>(&body)) return "stop " + to_string(m->round);
  if (const auto* m = std::get_if<pin_msg>(&body))
    return "pin " + to_string(m->round) + (m->release ? " release" : "");
  if (const auto* m = std::get_if<committed_msg>(&body))
    return "committed " + to_string(m->round) + " " + to_string(m->theta_crc);
  if (const auto* m = std::get_if<contribute_msg>(&body))
    return "contribute " + to_string(m->v_start) + " " + to_string(m->tokens);
  if (const auto* m = std::get_if<nccl_id_msg>(&body)) return "nccl_id " + to_string(m->epoch) + " " + m->id;
  if (const auto* m = std::get_if<standby_msg>(&body)) return "standby " + m->address;
  if (const auto* m = std::get_if<merge_msg>(&body)) {
    std::string out = "merge " + to_string(m->version);
    for (const auto* list : {&m->merged, &m->dropped}) {
      out += " [";
      for (const auto& e : *list)
        out +=
            e.node + "@" + to_string(e.v_start) + "x" + to_string(e.tokens) + "*" + to_string(e.parts) + " ";
      out += "]";
    }
    return out;
  }
  return "other";
}

}  // namespace

namespace {

/// A hello of cluster 7.
hello_msg make_hello(uint16_t version, const std::string& name, uint32_t workers,
                     const std::string& endpoint) {
  hello_msg h;
  h.protocol_version = version;
  h.cluster_id = 7;
  h.node_name = name;
  h.n_workers = workers;
  h.worker_offset = 5;
  h.data_endpoint = endpoint;
  return h;
}

}  // namespace

CATCH_TEST_CASE("control envelopes round-trip and oversized or foreign ones are rejected", "[cluster]") {
  envelope hello{7, 0xffffffffu, make_hello(protocol_version(), "node-a", 4, "tcp://10.0.0.1:5601")};
  auto f = build_envelope(hello);
  auto r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  const auto* hm = std::get_if<hello_msg>(&r.value().body);
  CATCH_REQUIRE(hm != nullptr);
  CATCH_CHECK(hm->node_name == "node-a");
  CATCH_CHECK(hm->n_workers == 4);
  CATCH_CHECK(hm->worker_offset == 5);
  CATCH_CHECK(hm->data_endpoint == "tcp://10.0.0.1:5601");
  CATCH_CHECK(hm->protocol_version == protocol_version());
  // The rounds a node holds checkpoints of travel in order; more than max_checkpoint_rounds are cut to the
  // newest on sending.
  auto h2 = make_hello(protocol_version(), "node-b", 1, "tcp://10.0.0.2:5601");
  for (uint64_t round = 1; round <= max_checkpoint_rounds + 6; ++round) h2.checkpoint_rounds.push_back(round);
  f = build_envelope(envelope{7, 0xffffffffu, h2});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  const auto& rounds = std::get<hello_msg>(r.value().body).checkpoint_rounds;
  CATCH_REQUIRE(rounds.size() == max_checkpoint_rounds);
  CATCH_CHECK(rounds.front() == 7);
  CATCH_CHECK(rounds.back() == max_checkpoint_rounds + 6);
  CATCH_CHECK(std::get<hello_msg>(r.value().body).checkpoint_thetas.empty());  // none given: not known
  // Their thetas' CRCs travel beside them, cut alike; a list of another length is not sent.
  for (uint64_t round = 1; round <= max_checkpoint_rounds + 6; ++round)
    h2.checkpoint_thetas.push_back(static_cast<uint32_t>(1000 + round));
  f = build_envelope(envelope{7, 0xffffffffu, h2});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  const auto& thetas = std::get<hello_msg>(r.value().body).checkpoint_thetas;
  CATCH_REQUIRE(thetas.size() == max_checkpoint_rounds);
  CATCH_CHECK(thetas.front() == 1007);
  CATCH_CHECK(thetas.back() == 1000 + max_checkpoint_rounds + 6);
  h2.checkpoint_thetas.pop_back();
  f = build_envelope(envelope{7, 0xffffffffu, h2});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(std::get<hello_msg>(r.value().body).checkpoint_thetas.empty());
  // A recover names the members' theta after its round.
  recover_msg rec;
  rec.round = 9;
  rec.theta_crc = 0xdeadbeef;
  f = build_envelope(envelope{7, 0xffffffffu, rec});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(std::get<recover_msg>(r.value().body).theta_crc == 0xdeadbeef);
  // Its training settings travel as they are (a coordinator names the keys that differ); a text past the
  // limit is not sent.
  auto h3 = make_hello(protocol_version(), "node-c", 1, "tcp://10.0.0.3:5601");
  h3.training_settings = "model.preset = \"tiny\"\ntrain.lr = 0.001\n";
  f = build_envelope(envelope{7, 0xffffffffu, h3});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(std::get<hello_msg>(r.value().body).training_settings == h3.training_settings);
  h3.training_settings = std::string(max_settings_bytes + 1, 'x');
  f = build_envelope(envelope{7, 0xffffffffu, h3});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(std::get<hello_msg>(r.value().body).training_settings.empty());

  // An async node's unapplied merges travel in its re-announcement, the oldest max_held_merges of them.
  auto h4 = make_hello(protocol_version(), "node-d", 1, "tcp://10.0.0.4:5601");
  h4.running = true;
  for (uint64_t v = 5; v < 5 + max_held_merges + 2; ++v)
    h4.merging.push_back(merge_msg{v, {{"node-a", v - 1, 100, 1}, {"node-d", v - 2, 50, 2}}, {}});
  f = build_envelope(envelope{7, 0xffffffffu, h4});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  const auto& merging = std::get<hello_msg>(r.value().body).merging;
  CATCH_REQUIRE(merging.size() == max_held_merges);
  CATCH_CHECK(merging.front().version == 5);
  CATCH_CHECK(merging.back().version == 4 + max_held_merges);
  CATCH_REQUIRE(merging.front().merged.size() == 2);
  CATCH_CHECK(merging.front().merged[1].node == "node-d");
  CATCH_CHECK(merging.front().merged[1].v_start == 3);
  CATCH_CHECK(merging.front().merged[1].tokens == 50);
  CATCH_CHECK(merging.front().merged[1].parts == 2);
  CATCH_CHECK(std::get<hello_msg>(r.value().body).newest_told == 0);
  h4.newest_told = 4 + max_held_merges + 2;
  f = build_envelope(envelope{7, 0xffffffffu, h4});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(std::get<hello_msg>(r.value().body).newest_told == 4 + max_held_merges + 2);
  // A contribution's seq travels with it (the master takes a repeat once).
  f = build_envelope(envelope{7, 2, contribute_msg{40, 81920, 17}});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(std::get<contribute_msg>(r.value().body).seq == 17);

  welcome_msg wm{1, 3, {{0, "a", "tcp://a:1", ""}, {1, "b", "tcp://b:1", ""}, {2, "c", "tcp://c:1", ""}},
                 0, 0, {}};
  // The coordinator term travels with every envelope (0 when the sender follows none yet).
  CATCH_CHECK(r.value().term == 0);
  f = build_envelope(envelope{7, 0, wm, 513});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  CATCH_CHECK(r.value().term == 513);
  f = build_envelope(envelope{7, 0, wm});
  r = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE(r.ok());
  const auto* w = std::get_if<welcome_msg>(&r.value().body);
  CATCH_REQUIRE(w != nullptr);
  CATCH_CHECK(
      (w->rank == 1 && w->world_size == 3 && w->peers.size() == 3 && w->peers[2].endpoint == "tcp://c:1"));

  for (const envelope& e :
       {envelope{7, 2, round_start_msg{9, 1, 1000, wire_dtype::int8}},
        envelope{7, 2, heartbeat_msg{9, 1700000000123}}, envelope{7, 2, heartbeat_msg{0, 17, 3, true}},
        envelope{7, 2, done_msg{9, 3}}, envelope{7, 2, error_msg{5, "deadline"}},
        envelope{7, 2, bye_msg{"done"}}, envelope{7, 2, stop_msg{41}},
        envelope{7, 2, committed_msg{41, 0xfeedbeef}}, envelope{7, 2, pin_msg{41, false}},
        envelope{7, 2, pin_msg{0, true}}, envelope{7, 2, contribute_msg{40, 81920}},
        envelope{7, 2, nccl_id_msg{3, std::string(256, 'a')}},
        envelope{7, 2, standby_msg{"tcp://10.0.0.2:5700"}},
        envelope{7, 2, merge_msg{41, {{"n0", 40, 81920, 1}, {"n2", 38, 163840, 2}}, {}}},
        envelope{7, 2, merge_msg{41, {}, {{"n3", 30, 1024, 1}}}}}) {
    f = build_envelope(e);
    r = parse_envelope(f.data(), f.size(), 7);
    CATCH_REQUIRE(r.ok());
    CATCH_CHECK(r.value().body.index() == e.body.index());
    CATCH_CHECK(fields_of(r.value().body) == fields_of(e.body));
    CATCH_CHECK(fields_of(e.body) != "other");
    CATCH_CHECK(r.value().sender == 2);
  }
  auto rs = parse_envelope(f.data(), f.size(), 8);
  CATCH_REQUIRE_FALSE(rs.ok());
  CATCH_CHECK(rs.error().reason == reject_reason::wrong_cluster);

  f = build_envelope(envelope{7, 0, make_hello(1, std::string(max_name_bytes + 1, 'x'), 1, "tcp://x:1")});
  rs = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE_FALSE(rs.ok());
  CATCH_CHECK(rs.error().reason == reject_reason::bad_size);
  f = build_envelope(envelope{7, 0, merge_msg{3, {{std::string(max_name_bytes + 1, 'n'), 2, 1, 1}}, {}}});
  rs = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE_FALSE(rs.ok());
  CATCH_CHECK(rs.error().reason == reject_reason::bad_size);
  CATCH_CHECK(rs.error().detail.find("merge merged node") != std::string::npos);
  f = build_envelope(envelope{7, 0, nccl_id_msg{3, std::string(max_nccl_id_bytes + 1, 'a')}});
  rs = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE_FALSE(rs.ok());
  CATCH_CHECK(rs.error().detail.find("NCCL id") != std::string::npos);
  f = build_envelope(envelope{7, 0, standby_msg{std::string(max_endpoint_bytes + 1, 'a')}});
  rs = parse_envelope(f.data(), f.size(), 7);
  CATCH_REQUIRE_FALSE(rs.ok());
  CATCH_CHECK(rs.error().detail.find("standby address") != std::string::npos);

  // A chunk header is not an envelope of ours: it decodes to a struct whose fields do not check out, or it is
  // refused; either way no exception escapes.
  comm::chunk_header ch;
  ch.cluster_id = 7;
  const auto hdr = comm::build_chunk_header(ch);
  (void)parse_envelope(hdr.data(), hdr.size(), 7);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 5000; ++i) {
    auto g = build_envelope(envelope{7, 0, wm});
    for (int k = 0; k < 3; ++k) g[rng() % g.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    (void)parse_envelope(g.data(), g.size(), 7);
  }
}
