// libFuzzer target: the StateRequest frame a state_server reads from a joiner (cluster::check_state_request,
// the server's own parse).
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

void write_seeds(const std::string& dir) {
  for (int kind = 0; kind < 2; ++kind) {
    capnp::MallocMessageBuilder mb;
    auto w = mb.initRoot<longwave::cluster::wire::StateRequest>();
    w.setProtocolVersion(longwave::comm::wire::PROTOCOL_VERSION);
    w.setClusterId(0x5eed);
    w.setKind(kind ? longwave::cluster::wire::StateRequestKind::CHUNK
                   : longwave::cluster::wire::StateRequestKind::OFFER);
    w.setRequestId(17);
    w.initKey().setRound(9);
    w.getKey().setFragment(1);
    w.setOffset(kind ? 1u << 20 : 0);
    w.setLength(kind ? 1u << 20 : 0);
    auto words = capnp::messageToFlatArray(mb);
    longwave::fuzz::write_seed(dir, kind ? "request_chunk" : "request_offer", words.asBytes().begin(),
                               words.asBytes().size());
  }
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)check_state_request(data, size);
  return 0;
}
