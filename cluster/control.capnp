# Control plane schema: the envelopes between nodes and their coordinator (cluster/envelope.hpp), one ZeroMQ
# frame each. Moved here from comm/wire.capnp with every struct, field and ordinal as it was: the bytes on the
# wire are unchanged. Ordinals are never renumbered and fields are only appended (STYLE.md, "Wire").
@0xeb3da9c4b1b8df85;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("longwave::cluster::wire");

using Comm = import "/comm/wire.capnp";
using ReduceKey = Comm.ReduceKey;
using Dtype = Comm.Dtype;

struct Hello {
  # A node asks to join the cluster.
  protocolVersion @0 :UInt16;
  clusterId @1 :UInt64;
  nodeName @2 :Text;
  nWorkers @3 :UInt32;
  dataEndpoint @4 :Text;   # where this node's ring socket is bound, e.g. "tcp://10.0.0.5:5601"
  resumeRound @5 :UInt64;  # completed outer rounds of this node's newest checkpoint (0: none)
  running @6 :Bool;        # a training node re-announcing itself to a restarted coordinator:
  epoch @7 :UInt64;        #   its epoch,
  worldSize @8 :UInt32;    #   that epoch's member count,
  committed @9 :ReduceKey; #   and the last all-reduce it applied
  configHash @10 :UInt64;  # the node's training fingerprint: it must equal the coordinator's
  stateEndpoint @11 :Text; # where this node serves its training state to joiners ("" : nowhere)
  dataFingerprint @12 :UInt64;  # its training data's fingerprint (0: not checked); must match the first node's
  checkpointRounds @13 :List(UInt64);  # the completed rounds of the checkpoints it holds, newest last
  trainingSettings @14 :Text;  # "section.key = value" lines its configHash covers ("": not sent)
  checkpointThetas @15 :List(UInt32);  # each one's history: its theta's CRC-32C (empty: not known)
  merging @16 :List(Merge);  # async, running: the merges it was told of and has not applied, oldest first
  newestTold @17 :UInt64;    # async, running: the newest of them (the list may stop short of it)
  workerOffset @18 :Int64 = -1;  # its first worker's global rank by its own cluster file (-1: not sent)
}

struct Peer {
  rank @0 :UInt32;
  name @1 :Text;
  endpoint @2 :Text;
  publicKey @3 :Text;      # the node's CURVE public key (Z85), "" when the cluster runs without CURVE
}

struct Welcome {
  # The coordinator's answer: the receiver's place in the ring and every peer's data endpoint.
  rank @0 :UInt32;
  worldSize @1 :UInt32;
  peers @2 :List(Peer);    # indexed by rank
  startRound @3 :UInt64;   # every node resumes from its newest checkpoint at or before this round
  epoch @4 :UInt64;        # the membership epoch the ring starts in
  keys @5 :List(Peer);     # CURVE: every node key the cluster admits (name, publicKey), for ring and state links
}


struct Fence {
  # Coordinator -> node: membership is changing to `epoch`: abandon the all-reduce in flight, start none, and
  # report what you hold (FenceAck).
  epoch @0 :UInt64;
}

struct FenceAck {
  # Node -> coordinator, once its ring is idle after a Fence.
  epoch @0 :UInt64;
  committed @1 :ReduceKey;  # the last all-reduce this node applied (0, 0: none)
  hasPending @2 :Bool;      # an all-reduce was in flight
  pending @3 :ReduceKey;
  haveResult @4 :Bool;      # ... and its result had arrived (only its confirmation was missing)
}

struct Membership {
  # Coordinator -> node: the members of `epoch` in ring order, the receiver's rank, and the fate of the
  # all-reduce the fence interrupted: the one at `commit` is kept by nodes that hold its result, every other
  # one is redone in this epoch.
  epoch @0 :UInt64;
  rank @1 :UInt32;
  peers @2 :List(Peer);
  commit @3 :ReduceKey;
  workers @4 :List(UInt32);  # each member's worker count, indexed by rank
  keys @5 :List(Peer);       # CURVE: every node key the cluster admits, as in Welcome
}

struct Leave {
  # Asks node `node` to leave the cluster at its next round boundary (from `longwave node --leave` to the
  # coordinator, which forwards it to the node).
  node @0 :Text;
}

struct Stop {
  # Stopping the whole cluster at one round boundary (`longwave stop`). The requester sends round 0 to the
  # coordinator; the coordinator asks every member (round 0); each member answers with the round after which
  # it holds (its current round, round S); once all have, the coordinator tells every member the round after
  # which all stop (round R, the largest S): each trains to R, saves its checkpoint and says bye "stopped".
  round @0 :UInt64;
  answer @1 :Bool;  # a member's answer (S, or the R it was told), never a request: one that reaches a
                    # coordinator that does not know the member yet (it took the cluster over) is dropped
}

struct Pin {
  # Holding the members at one round boundary while a joiner fetches that round's state, so that a fetch
  # slower than a round still gets in. Coordinator -> member: round 0 asks where it can hold (it answers with
  # the round S after which it holds, as for Stop); round R > 0: hold after round R (training on to it if it
  # is behind); release: go on. Member -> coordinator: round S.
  round @0 :UInt64;
  release @1 :Bool;
}

struct Committed {
  # Node -> coordinator: theta_global after round `round` has CRC-32C `thetaCrc` (the coordinator compares
  # the members' and names a mismatch: they no longer train one model).
  round @0 :UInt64;
  thetaCrc @1 :UInt32;
}

struct RingFailed {
  # Node -> coordinator: an all-reduce of `epoch` failed (e.g. the next rank's connection dropped).
  epoch @0 :UInt64;
  suspect @1 :Text;        # the node the ring lost, if it knows one
  reason @2 :Text;
}

struct Recover {
  # The coordinator lets a node join the running cluster: fetch the state from these members' state
  # servers, then say joinReady. Sent again when the state it fetched is stale.
  epoch @0 :UInt64;
  sources @1 :List(Peer);  # endpoint: each member's state server
  note @2 :Text;           # why, when sent again
  round @3 :UInt64;        # the round the members last reported (a joiner with a checkpoint of it uses that)
  workerOffset @4 :UInt64; # the global rank of the joiner's first worker (its data regions)
  thetaCrc @5 :UInt32;     # theta's CRC-32C after `round` as the members reported it (0: not known)
}

struct JoinReady {
  # A joiner holds the state after the all-reduce `key` (round `round`) and is ready to be admitted.
  key @0 :ReduceKey;
  round @1 :UInt64;
}

struct RoundStart {
  round @0 :UInt64;
  fragment @1 :UInt32;
  nElements @2 :UInt64;
  dtype @3 :Dtype;
}

struct Heartbeat {
  round @0 :UInt64;
  unixMillis @1 :UInt64;
  epoch @2 :UInt64;        # the membership epoch the node trains in
  starting @3 :Bool;       # from a node still starting (model, checkpoint, communicator): alive, not training
}

struct Done {
  round @0 :UInt64;
  fragment @1 :UInt32;
}

struct Error {
  code @0 :UInt16;         # a longwave::errc value
  message @1 :Text;
}

struct Bye {
  reason @0 :Text;
}

struct MergeEntry {
  # One contribution to an asynchronous merge: node `node` trained `tokens` tokens from version `vStart`
  # (`parts` reports folded into one).
  node @0 :Text;
  vStart @1 :UInt64;
  tokens @2 :UInt64;
  parts @3 :UInt32;
}

struct Contribute {
  # Node -> coordinator (diloco.outer = "async"): this node's pseudo-gradient is ready to merge.
  vStart @0 :UInt64;
  tokens @1 :UInt64;
  seq @2 :UInt64;  # this node process's count of its contributions, from 1: a repeat is known (0: not sent)
}

struct Merge {
  # Coordinator -> members (diloco.outer = "async"): version `version` of theta is the one before plus the
  # pseudo-gradients of `merged`; each node listed sends its pending one into the all-reduce of
  # (version, 0), the others relay zeros. `dropped`: contributions refused since the last merge (too stale,
  # or their node left); a node listed there discards its pending one. A merge with none merged only drops.
  version @0 :UInt64;
  merged @1 :List(MergeEntry);
  dropped @2 :List(MergeEntry);
}

struct NcclId {
  # comm.backend = "nccl": the unique id of epoch `epoch`'s NCCL communicator, as hex. That epoch's rank 0
  # makes it (node -> coordinator), and the coordinator hands it to the epoch's other members.
  epoch @0 :UInt64;
  id @1 :Text;
}

struct Standby {
  # A standby coordinator -> the one that leads, every few seconds while it stands by: when the cluster ends
  # (stopped, finished, called off) the leader tells it so with a Bye, and it ends instead of taking over.
  address @0 :Text;  # where the standby would listen (one of [cluster] coordinator)
}

struct Envelope {
  clusterId @0 :UInt64;
  sender @1 :UInt32;       # sender's rank; 0xffffffff before it has one
  body :union {
    hello @2 :Hello;
    welcome @3 :Welcome;
    roundStart @4 :RoundStart;
    heartbeat @5 :Heartbeat;
    done @6 :Done;
    error @7 :Error;
    bye @8 :Bye;
    fence @9 :Fence;
    fenceAck @10 :FenceAck;
    membership @11 :Membership;
    ringFailed @12 :RingFailed;
    leave @13 :Leave;
    recover @14 :Recover;
    joinReady @15 :JoinReady;
    stop @16 :Stop;
    committed @17 :Committed;
    pin @18 :Pin;
    contribute @20 :Contribute;
    merge @21 :Merge;
    ncclId @22 :NcclId;
    standby @23 :Standby;
  }
  # The sending coordinator's term, or the newest term a node follows (0: none yet). A node ignores a
  # coordinator of an older term; a coordinator that hears of a newer one steps down.
  term @19 :UInt64;
}
