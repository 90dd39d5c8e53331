# Longwave wire schema, data plane: the header frame of ring all-reduce data chunks, and the types the control
# plane's schemas share (cluster/control.capnp, cluster/state.capnp import this file; one protocol version
# covers all three). Ordinals are never renumbered and fields are only appended (STYLE.md, "Wire"). Bulk
# payloads are never Data fields: a chunk travels as two ZeroMQ frames, [ChunkHeader][raw payload bytes] (see
# comm/frame.hpp).
@0xa61e113a5c87c245;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("longwave::comm::wire");

# Versions: 4: Stop (longwave stop), Committed; 5: Pin (a slow joiner gets in), Hello.dataFingerprint;
# 6: Hello.checkpointRounds, Error not_announced; 7: Envelope.term; 8: an all-reduce's confirmation carries
# every rank's note (its contributors and step time).
const protocolVersion :UInt16 = 9;

enum Dtype {
  fp32 @0;
  fp16 @1;
  bf16 @2;
  int8 @3;
  sparse @4;   # all-gather frames of sparse messages: element and byte counts are bytes
}

enum Phase {
  reduceScatter @0;
  allGather @1;
}

struct ReduceKey {
  # One all-reduce of the run: (round, fragment), increasing from call to call.
  round @0 :UInt64;
  fragment @1 :UInt32;
}

# ---- data plane: the first of two ZeroMQ frames; the second is the payload ----

struct ChunkHeader {
  protocolVersion @0 :UInt16;
  clusterId @1 :UInt64;
  round @2 :UInt64;
  fragment @3 :UInt32;     # model fragment (streaming DiLoCo); 0 when the whole vector is reduced
  phase @4 :Phase;
  step @5 :UInt32;         # ring step within the phase, 0 .. worldSize-2
  segment @6 :UInt32;      # ring segment the chunk belongs to, 0 .. worldSize-1
  chunk @7 :UInt32;        # chunk index within the segment
  sender @8 :UInt32;       # sender's rank
  worldSize @9 :UInt32;
  dtype @10 :Dtype;
  totalElements @11 :UInt64; # length of the whole vector being reduced
  elementCount @12 :UInt64;  # values in this chunk
  byteCount @13 :UInt64;     # exact length of the payload frame
  checksum @14 :UInt32;      # CRC-32C (Castagnoli) of the payload frame
  weight @15 :Float64;       # reduce-scatter: sum of the weights in the payload; all-gather: the total weight
  epoch @16 :UInt64;         # membership epoch the all-reduce runs in
}
