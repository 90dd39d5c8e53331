// libFuzzer target: the StateReply header frame fetch_state reads from a member's state server
// (cluster::check_state_reply, the fetcher's own parse): offers with their block checksums, chunk headers,
// and the gone / refused / badRequest answers.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstddef>
#include <cstdint>

#include "cluster/state.capnp.h"
#include "cluster/state_fetcher.hpp"
#include "cluster/state_server.hpp"
#include "comm/wire.capnp.h"
#include "fuzz/fuzz_seeds.hpp"

using namespace longwave::comm;
using namespace longwave::cluster;

namespace {

// A reply of ours with the given status, as the server starts each one.
longwave::cluster::wire::StateReply::Builder start_reply(capnp::MallocMessageBuilder& mb,
                                                         longwave::cluster::wire::StateStatus status,
                                                         uint64_t id) {
  auto w = mb.initRoot<longwave::cluster::wire::StateReply>();
  w.setProtocolVersion(longwave::comm::wire::PROTOCOL_VERSION);
  w.setClusterId(0x5eed);
  w.setStatus(status);
  w.setRequestId(id);
  return w;
}

void write_seeds(const std::string& dir) {
  const auto put = [&](const char* name, capnp::MallocMessageBuilder& mb) {
    auto words = capnp::messageToFlatArray(mb);
    longwave::fuzz::write_seed(dir, name, words.asBytes().begin(), words.asBytes().size());
  };
  {
    capnp::MallocMessageBuilder mb;
    auto w = start_reply(mb, longwave::cluster::wire::StateStatus::OFFER, 1);
    auto offers = w.initOffers(2);
    for (unsigned i = 0; i < 2; ++i) {
      auto o = offers[i];
      o.initKey().setRound(9 - i);
      o.setRound(9 - i);
      o.setTotalBytes((3u << 20) + 100);
      o.setChecksum(0x1234 + i);
      o.setBlockBytes(1u << 20);
      auto sums = o.initBlockChecksums(4);
      for (unsigned b = 0; b < 4; ++b) sums.set(b, 0xabc0 + b);
    }
    put("reply_offer", mb);
  }
  {
    capnp::MallocMessageBuilder mb;
    auto w = start_reply(mb, longwave::cluster::wire::StateStatus::CHUNK, 2);
    w.initKey().setRound(9);
    w.setOffset(1u << 20);
    w.setLength(1u << 20);
    w.setChecksum(0xdeadbeef);
    put("reply_chunk", mb);
  }
  {
    capnp::MallocMessageBuilder mb;
    auto w = start_reply(mb, longwave::cluster::wire::StateStatus::GONE, 3);
    w.setMessage("state (round 9, fragment 0) is not held here (newest: (round 11, fragment 0))");
    put("reply_gone", mb);
  }
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)check_state_reply(data, size);
  return 0;
}
