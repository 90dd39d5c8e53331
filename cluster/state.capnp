# State transfer schema (cluster/state_server.hpp, cluster/state_fetcher.hpp): a joiner downloads the live
# training state. Moved here from comm/wire.capnp unchanged: the bytes on the wire are the same.
@0xc2f6eef76701bf1e;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("longwave::cluster::wire");

using Comm = import "/comm/wire.capnp";
using ReduceKey = Comm.ReduceKey;

# A request is one frame from the joiner's DEALER; a reply is one StateReply frame, followed for a chunk by the
# chunk's raw bytes as a second frame.

enum StateRequestKind {
  offer @0;  # which states do you hold?
  chunk @1;  # bytes [offset, offset + length) of state `key`
}

struct StateRequest {
  protocolVersion @0 :UInt16;
  clusterId @1 :UInt64;
  kind @2 :StateRequestKind;
  requestId @3 :UInt64;    # echoed in the reply
  key @4 :ReduceKey;       # chunk: the state
  offset @5 :UInt64;       # chunk: a multiple of the offer's blockBytes
  length @6 :UInt64;       # chunk: at most maxStateChunkBytes, within the state
}

enum StateStatus {
  offer @0;       # offers holds the states served, newest first
  chunk @1;       # the payload frame follows
  gone @2;        # the key is not held (any more): the server has published twice since
  refused @3;     # another cluster's request
  badRequest @4;  # the request failed validation; message says why
}

struct StateOffer {
  key @0 :ReduceKey;
  round @1 :UInt64;          # completed outer rounds
  totalBytes @2 :UInt64;
  checksum @3 :UInt32;       # CRC-32C of the whole state
  blockBytes @4 :UInt64;     # the state in blocks of this size (the last may be shorter)
  blockChecksums @5 :List(UInt32);  # CRC-32C of each block
}

struct StateReply {
  protocolVersion @0 :UInt16;
  clusterId @1 :UInt64;      # the server's
  status @2 :StateStatus;
  requestId @3 :UInt64;
  offers @4 :List(StateOffer);
  key @5 :ReduceKey;         # chunk
  offset @6 :UInt64;         # chunk
  length @7 :UInt64;         # chunk: exact length of the payload frame
  checksum @8 :UInt32;       # chunk: CRC-32C of the payload frame
  message @9 :Text;          # gone, refused, badRequest: why
}
