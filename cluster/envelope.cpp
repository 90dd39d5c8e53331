// Control envelopes built and parsed with explicit limits (see envelope.hpp). Nothing here trusts a peer:
// every size is checked before use and every Cap'n Proto (kj) exception is turned into a rejection.
#include "cluster/envelope.hpp"

#include <fmt/format.h>

#include "cluster/control.capnp.h"
#include "comm/capnp_frame.hpp"
#include "comm/curve.hpp"

namespace longwave::cluster {

using namespace comm;  // the frame helpers (comm/capnp_frame.hpp)

namespace {

void set_peers(capnp::List<wire::Peer>::Builder out, const std::vector<peer_entry>& peers) {
  for (size_t i = 0; i < peers.size(); ++i) {
    const auto k = static_cast<unsigned>(i);
    out[k].setRank(peers[i].rank);
    out[k].setName(txt(peers[i].name));
    out[k].setEndpoint(txt(peers[i].endpoint));
    out[k].setPublicKey(txt(peers[i].public_key));
  }
}

void set_key(comm::wire::ReduceKey::Builder out, const reduce_key& k) {
  out.setRound(k.round);
  out.setFragment(k.fragment);
}

reduce_key key_of(comm::wire::ReduceKey::Reader r) {
  return {r.getRound(), r.getFragment()};
}

/// A peer list within max_peers whose texts are within their limits; `what` names the message.
std::optional<rejection> read_peers(capnp::List<wire::Peer>::Reader peers, const char* what,
                                    std::vector<peer_entry>& out) {
  if (peers.size() > max_peers)
    return rejection{reject_reason::bad_size,
                     fmt::format("{} lists {} peers, limit {}", what, peers.size(), max_peers)};
  for (auto p : peers) {
    auto name = p.getName();
    auto ep = p.getEndpoint();
    auto key = p.getPublicKey();
    if (auto bad = check_text(name, max_name_bytes, fmt::format("{} peer name", what).c_str())) return bad;
    if (auto bad = check_text(ep, max_endpoint_bytes, fmt::format("{} peer endpoint", what).c_str()))
      return bad;
    if (auto bad = check_text(key, 40, fmt::format("{} peer key", what).c_str())) return bad;
    auto key_text = text_of(key);
    if (!key_text.empty() && !is_z85_key(key_text))
      return rejection{
          reject_reason::malformed,
          fmt::format("{} peer {}: its public key is not 40 characters of Z85", what, text_of(name))};
    out.push_back(peer_entry{p.getRank(), text_of(name), text_of(ep), std::move(key_text)});
  }
  return std::nullopt;
}

void set_entries(capnp::List<wire::MergeEntry>::Builder out, const std::vector<merge_entry>& entries) {
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto k = static_cast<unsigned>(i);
    out[k].setNode(txt(entries[i].node));
    out[k].setVStart(entries[i].v_start);
    out[k].setTokens(entries[i].tokens);
    out[k].setParts(entries[i].parts);
  }
}

void set_merge(wire::Merge::Builder x, const merge_msg& m) {
  x.setVersion(m.version);
  set_entries(x.initMerged(static_cast<unsigned>(m.merged.size())), m.merged);
  set_entries(x.initDropped(static_cast<unsigned>(m.dropped.size())), m.dropped);
}

/// A merge list within max_peers whose node names are within their limit.
std::optional<rejection> read_entries(capnp::List<wire::MergeEntry>::Reader entries, const char* what,
                                      std::vector<merge_entry>& out) {
  if (entries.size() > max_peers)
    return rejection{reject_reason::bad_size,
                     fmt::format("{} lists {} contributions, limit {}", what, entries.size(), max_peers)};
  for (auto e : entries) {
    auto node = e.getNode();
    if (auto bad = check_text(node, max_name_bytes, fmt::format("{} node", what).c_str())) return bad;
    out.push_back(merge_entry{text_of(node), e.getVStart(), e.getTokens(), e.getParts()});
  }
  return std::nullopt;
}

/// A merge's version and its lists, each within max_peers.
std::optional<rejection> read_merge_fields(wire::Merge::Reader x, merge_msg& m) {
  m.version = x.getVersion();
  if (auto bad = read_entries(x.getMerged(), "merge merged", m.merged)) return bad;
  return read_entries(x.getDropped(), "merge dropped", m.dropped);
}

}  // namespace

std::vector<std::byte> build_envelope(const envelope& e) {
  capnp::MallocMessageBuilder mb;
  auto w = mb.initRoot<wire::Envelope>();
  w.setClusterId(e.cluster_id);
  w.setSender(e.sender);
  w.setTerm(e.term);
  auto body = w.initBody();
  struct visitor {
    wire::Envelope::Body::Builder& b;
    void operator()(const hello_msg& m) {
      auto x = b.initHello();
      x.setProtocolVersion(m.protocol_version);
      x.setClusterId(m.cluster_id);
      x.setNodeName(txt(m.node_name));
      x.setNWorkers(m.n_workers);
      x.setDataEndpoint(txt(m.data_endpoint));
      x.setWorkerOffset(m.worker_offset);
      x.setResumeRound(m.resume_round);
      x.setRunning(m.running);
      x.setEpoch(m.epoch);
      x.setWorldSize(m.world_size);
      set_key(x.initCommitted(), m.committed);
      x.setConfigHash(m.config_hash);
      x.setStateEndpoint(txt(m.state_endpoint));
      x.setDataFingerprint(m.data_fingerprint);
      const size_t n = std::min(m.checkpoint_rounds.size(), max_checkpoint_rounds);
      auto rounds = x.initCheckpointRounds(static_cast<unsigned>(n));
      for (size_t i = 0; i < n; ++i)
        rounds.set(static_cast<unsigned>(i), m.checkpoint_rounds[m.checkpoint_rounds.size() - n + i]);
      if (m.checkpoint_thetas.size() == m.checkpoint_rounds.size()) {
        auto thetas = x.initCheckpointThetas(static_cast<unsigned>(n));
        for (size_t i = 0; i < n; ++i)
          thetas.set(static_cast<unsigned>(i), m.checkpoint_thetas[m.checkpoint_thetas.size() - n + i]);
      }
      if (m.training_settings.size() <= max_settings_bytes) x.setTrainingSettings(txt(m.training_settings));
      const size_t held = std::min(m.merging.size(), max_held_merges);  // the oldest: they come first
      auto merging = x.initMerging(static_cast<unsigned>(held));
      for (size_t i = 0; i < held; ++i) set_merge(merging[static_cast<unsigned>(i)], m.merging[i]);
      x.setNewestTold(m.newest_told);
    }
    void operator()(const welcome_msg& m) {
      auto x = b.initWelcome();
      x.setRank(m.rank);
      x.setWorldSize(m.world_size);
      x.setStartRound(m.start_round);
      x.setEpoch(m.epoch);
      set_peers(x.initPeers(static_cast<unsigned>(m.peers.size())), m.peers);
      set_peers(x.initKeys(static_cast<unsigned>(m.keys.size())), m.keys);
    }
    void operator()(const fence_msg& m) { b.initFence().setEpoch(m.epoch); }
    void operator()(const fence_ack_msg& m) {
      auto x = b.initFenceAck();
      x.setEpoch(m.epoch);
      set_key(x.initCommitted(), m.committed);
      x.setHasPending(m.has_pending);
      set_key(x.initPending(), m.pending);
      x.setHaveResult(m.have_result);
    }
    void operator()(const membership_msg& m) {
      auto x = b.initMembership();
      x.setEpoch(m.epoch);
      x.setRank(m.rank);
      set_peers(x.initPeers(static_cast<unsigned>(m.peers.size())), m.peers);
      auto w = x.initWorkers(static_cast<unsigned>(m.workers.size()));
      for (size_t i = 0; i < m.workers.size(); ++i) w.set(static_cast<unsigned>(i), m.workers[i]);
      set_key(x.initCommit(), m.commit);
      set_peers(x.initKeys(static_cast<unsigned>(m.keys.size())), m.keys);
    }
    void operator()(const leave_msg& m) { b.initLeave().setNode(txt(m.node)); }
    void operator()(const stop_msg& m) {
      auto x = b.initStop();
      x.setRound(m.round);
      x.setAnswer(m.answer);
    }
    void operator()(const pin_msg& m) {
      auto x = b.initPin();
      x.setRound(m.round);
      x.setRelease(m.release);
    }
    void operator()(const committed_msg& m) {
      auto x = b.initCommitted();
      x.setRound(m.round);
      x.setThetaCrc(m.theta_crc);
    }
    void operator()(const recover_msg& m) {
      auto x = b.initRecover();
      x.setEpoch(m.epoch);
      set_peers(x.initSources(static_cast<unsigned>(m.sources.size())), m.sources);
      x.setNote(txt(m.note));
      x.setRound(m.round);
      x.setWorkerOffset(m.worker_offset);
      x.setThetaCrc(m.theta_crc);
    }
    void operator()(const join_ready_msg& m) {
      auto x = b.initJoinReady();
      set_key(x.initKey(), m.key);
      x.setRound(m.round);
    }
    void operator()(const ring_failed_msg& m) {
      auto x = b.initRingFailed();
      x.setEpoch(m.epoch);
      x.setSuspect(txt(m.suspect));
      x.setReason(txt(m.reason));
    }
    void operator()(const round_start_msg& m) {
      auto x = b.initRoundStart();
      x.setRound(m.round);
      x.setFragment(m.fragment);
      x.setNElements(m.n_elements);
      x.setDtype(to_wire(m.dtype));
    }
    void operator()(const heartbeat_msg& m) {
      auto x = b.initHeartbeat();
      x.setRound(m.round);
      x.setUnixMillis(m.unix_millis);
      x.setEpoch(m.epoch);
      x.setStarting(m.starting);
    }
    void operator()(const done_msg& m) {
      auto x = b.initDone();
      x.setRound(m.round);
      x.setFragment(m.fragment);
    }
    void operator()(const error_msg& m) {
      auto x = b.initError();
      x.setCode(m.code);
      x.setMessage(txt(m.message));
    }
    void operator()(const bye_msg& m) { b.initBye().setReason(txt(m.reason)); }
    void operator()(const contribute_msg& m) {
      auto x = b.initContribute();
      x.setVStart(m.v_start);
      x.setTokens(m.tokens);
      x.setSeq(m.seq);
    }
    void operator()(const nccl_id_msg& m) {
      auto x = b.initNcclId();
      x.setEpoch(m.epoch);
      x.setId(txt(m.id));
    }
    void operator()(const merge_msg& m) { set_merge(b.initMerge(), m); }
    void operator()(const standby_msg& m) { b.initStandby().setAddress(txt(m.address)); }
  };
  std::visit(visitor{body}, e.body);
  return flat_bytes(mb);
}

namespace {

using body_t = decltype(envelope::body);
using read_result = std::optional<rejection>;  // nullopt: read into the body

read_result read_hello(wire::Hello::Reader x, body_t& out) {
  hello_msg m;
  m.protocol_version = x.getProtocolVersion();
  m.cluster_id = x.getClusterId();
  m.n_workers = x.getNWorkers();
  m.resume_round = x.getResumeRound();
  m.running = x.getRunning();
  m.epoch = x.getEpoch();
  m.world_size = x.getWorldSize();
  m.committed = key_of(x.getCommitted());
  m.config_hash = x.getConfigHash();
  m.data_fingerprint = x.getDataFingerprint();
  const auto rounds = x.getCheckpointRounds();
  if (rounds.size() > max_checkpoint_rounds)
    return reject(reject_reason::bad_size, fmt::format("hello checkpointRounds has {} entries, limit {}",
                                                       rounds.size(), max_checkpoint_rounds));
  for (const auto r : rounds) m.checkpoint_rounds.push_back(r);
  const auto thetas = x.getCheckpointThetas();
  if (thetas.size() != 0 && thetas.size() != rounds.size())
    return reject(reject_reason::malformed, fmt::format("hello checkpointThetas has {} entries for {} rounds",
                                                        thetas.size(), rounds.size()));
  for (const auto t : thetas) m.checkpoint_thetas.push_back(t);
  // The oldest max_held_merges are read (a node of a later release may send more; newestTold covers them).
  for (auto held : x.getMerging()) {
    if (m.merging.size() == max_held_merges) break;
    if (auto bad = read_merge_fields(held, m.merging.emplace_back())) return bad;
  }
  m.newest_told = x.getNewestTold();
  m.worker_offset = x.getWorkerOffset();
  auto name = x.getNodeName();
  auto ep = x.getDataEndpoint();
  auto state_ep = x.getStateEndpoint();
  if (auto bad = check_text(name, max_name_bytes, "hello nodeName")) return bad;
  if (auto bad = check_text(ep, max_endpoint_bytes, "hello dataEndpoint")) return bad;
  if (auto bad = check_text(state_ep, max_endpoint_bytes, "hello stateEndpoint")) return bad;
  auto settings = x.getTrainingSettings();
  if (auto bad = check_text(settings, max_settings_bytes, "hello trainingSettings")) return bad;
  m.training_settings = text_of(settings);
  m.node_name = text_of(name);
  m.data_endpoint = text_of(ep);
  m.state_endpoint = text_of(state_ep);
  out = std::move(m);
  return std::nullopt;
}

read_result read_welcome(wire::Welcome::Reader x, body_t& out) {
  welcome_msg m;
  m.rank = x.getRank();
  m.world_size = x.getWorldSize();
  m.start_round = x.getStartRound();
  m.epoch = x.getEpoch();
  if (auto bad = read_peers(x.getPeers(), "welcome", m.peers)) return bad;
  if (auto bad = read_peers(x.getKeys(), "welcome keys", m.keys)) return bad;
  out = std::move(m);
  return std::nullopt;
}

read_result read_membership(wire::Membership::Reader x, body_t& out) {
  membership_msg m;
  m.epoch = x.getEpoch();
  m.rank = x.getRank();
  m.commit = key_of(x.getCommit());
  if (auto bad = read_peers(x.getPeers(), "membership", m.peers)) return bad;
  if (auto bad = read_peers(x.getKeys(), "membership keys", m.keys)) return bad;
  auto w = x.getWorkers();
  if (w.size() != m.peers.size() || m.rank >= m.peers.size())
    return reject(reject_reason::bad_size,
                  fmt::format("membership of {} peers has {} worker counts and rank {}", m.peers.size(),
                              w.size(), m.rank));
  for (auto v : w) m.workers.push_back(v);
  out = std::move(m);
  return std::nullopt;
}

read_result read_recover(wire::Recover::Reader x, body_t& out) {
  recover_msg m;
  m.epoch = x.getEpoch();
  m.round = x.getRound();
  m.worker_offset = x.getWorkerOffset();
  m.theta_crc = x.getThetaCrc();
  auto note = x.getNote();
  if (auto bad = check_text(note, max_message_bytes, "recover note")) return bad;
  m.note = text_of(note);
  if (auto bad = read_peers(x.getSources(), "recover", m.sources)) return bad;
  out = std::move(m);
  return std::nullopt;
}

read_result read_ring_failed(wire::RingFailed::Reader x, body_t& out) {
  auto suspect = x.getSuspect();
  auto reason = x.getReason();
  if (auto bad = check_text(suspect, max_name_bytes, "ringFailed suspect")) return bad;
  if (auto bad = check_text(reason, max_message_bytes, "ringFailed reason")) return bad;
  out = ring_failed_msg{x.getEpoch(), text_of(suspect), text_of(reason)};
  return std::nullopt;
}

read_result read_round_start(wire::RoundStart::Reader x, body_t& out) {
  const auto dt = static_cast<uint16_t>(x.getDtype());
  if (!known_dtype(dt))
    return reject(reject_reason::bad_dtype, fmt::format("roundStart has unknown dtype {}", dt));
  out = round_start_msg{x.getRound(), x.getFragment(), x.getNElements(), static_cast<wire_dtype>(dt)};
  return std::nullopt;
}

/// A message of one text field: Msg{text} once the text is within limit.
template <class Msg>
read_result read_text(capnp::Text::Reader t, size_t limit, const char* field, body_t& out) {
  if (auto bad = check_text(t, limit, field)) return bad;
  out = Msg{text_of(t)};
  return std::nullopt;
}

read_result read_error(wire::Error::Reader x, body_t& out) {
  auto msg = x.getMessage();
  if (auto bad = check_text(msg, max_message_bytes, "error message")) return bad;
  out = error_msg{x.getCode(), text_of(msg)};
  return std::nullopt;
}

read_result read_merge(wire::Merge::Reader x, body_t& out) {
  merge_msg m;
  if (auto bad = read_merge_fields(x, m)) return bad;
  out = std::move(m);
  return std::nullopt;
}

read_result read_body(wire::Envelope::Body::Reader b, body_t& out) {
  using B = wire::Envelope::Body;
  switch (b.which()) {
    case B::HELLO: return read_hello(b.getHello(), out);
    case B::WELCOME: return read_welcome(b.getWelcome(), out);
    case B::FENCE: out = fence_msg{b.getFence().getEpoch()}; return std::nullopt;
    case B::FENCE_ACK: {
      auto x = b.getFenceAck();
      out = fence_ack_msg{x.getEpoch(), key_of(x.getCommitted()), x.getHasPending(), key_of(x.getPending()),
                          x.getHaveResult()};
      return std::nullopt;
    }
    case B::MEMBERSHIP: return read_membership(b.getMembership(), out);
    case B::LEAVE: return read_text<leave_msg>(b.getLeave().getNode(), max_name_bytes, "leave node", out);
    case B::STOP: out = stop_msg{b.getStop().getRound(), b.getStop().getAnswer()}; return std::nullopt;
    case B::PIN: out = pin_msg{b.getPin().getRound(), b.getPin().getRelease()}; return std::nullopt;
    case B::COMMITTED:
      out = committed_msg{b.getCommitted().getRound(), b.getCommitted().getThetaCrc()};
      return std::nullopt;
    case B::RECOVER: return read_recover(b.getRecover(), out);
    case B::JOIN_READY:
      out = join_ready_msg{key_of(b.getJoinReady().getKey()), b.getJoinReady().getRound()};
      return std::nullopt;
    case B::RING_FAILED: return read_ring_failed(b.getRingFailed(), out);
    case B::ROUND_START: return read_round_start(b.getRoundStart(), out);
    case B::HEARTBEAT: {
      auto x = b.getHeartbeat();
      out = heartbeat_msg{x.getRound(), x.getUnixMillis(), x.getEpoch(), x.getStarting()};
      return std::nullopt;
    }
    case B::DONE: out = done_msg{b.getDone().getRound(), b.getDone().getFragment()}; return std::nullopt;
    case B::ERROR: return read_error(b.getError(), out);
    case B::BYE: return read_text<bye_msg>(b.getBye().getReason(), max_message_bytes, "bye reason", out);
    case B::CONTRIBUTE:
      out = contribute_msg{b.getContribute().getVStart(), b.getContribute().getTokens(),
                           b.getContribute().getSeq()};
      return std::nullopt;
    case B::MERGE: return read_merge(b.getMerge(), out);
    case B::NCCL_ID: {
      auto x = b.getNcclId();
      if (auto bad = check_text(x.getId(), max_nccl_id_bytes, "NCCL id")) return bad;
      out = nccl_id_msg{x.getEpoch(), text_of(x.getId())};
      return std::nullopt;
    }
    case B::STANDBY:
      return read_text<standby_msg>(b.getStandby().getAddress(), max_endpoint_bytes, "standby address", out);
  }
  return reject(reject_reason::malformed,
                fmt::format("envelope carries unknown message kind {}", static_cast<unsigned>(b.which())));
}

}  // namespace

frame_result<envelope> parse_envelope(const void* data, size_t size, uint64_t expected_cluster_id) {
  auto framed = check_framing(data, size, max_envelope_bytes, "envelope");
  if (!framed) return framed.error();
  const auto& words = framed.value().words;
  envelope out;
  std::optional<rejection> bad;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         reader_options(words.size(), 8));
    auto r = reader.getRoot<wire::Envelope>();
    out.cluster_id = r.getClusterId();
    out.sender = r.getSender();
    out.term = r.getTerm();
    if (out.cluster_id != expected_cluster_id)
      return reject(reject_reason::wrong_cluster, fmt::format("cluster id {:#x}, this node is in {:#x}",
                                                              out.cluster_id, expected_cluster_id));
    bad = read_body(r.getBody(), out.body);
  } catch (const kj::Exception& e) {
    return reject(reject_reason::malformed, "envelope does not decode: " + kj_text(e));
  }
  if (bad) return *bad;
  return out;
}

}  // namespace longwave::cluster
