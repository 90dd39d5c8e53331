// A node's connection to the cluster's master (see control_client.hpp).
#include "cluster/control_client.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/control_common.hpp"

namespace longwave::cluster {

using namespace comm;
using namespace control;

control_client::control_client(std::string coordinator_endpoint, uint64_t cluster_id)
    : control_client(std::vector<std::string>{std::move(coordinator_endpoint)}, cluster_id) {}

control_client::control_client(std::vector<std::string> coordinator_endpoints, uint64_t cluster_id,
                               std::optional<curve_peer> curve)
    : endpoint_(join_names(coordinator_endpoints)),
      endpoints_(std::move(coordinator_endpoints)),
      cluster_id_(cluster_id),
      curve_peer_(std::move(curve)),
      curve_(curve_peer_.has_value()) {
  ctx_ = std::make_unique<zmq::context_t>(1);
  // A routing id of its own, kept across reconnections: the coordinator tells this process from another one
  // with the same node name, and knows it again after a dropped connection.
  std::random_device rd;
  routing_id_ = fmt::format("lw-node-{}-{:08x}", static_cast<long>(getpid()), rd());
  open();
}

control_client::~control_client() {
  close();
}

std::vector<control_event> control_client::poll() {
  std::vector<control_event> out = std::move(pending_);
  pending_.clear();
  drain_monitor(out);
  if (reopen_at_ && clock::now() >= *reopen_at_) {
    reopen_at_.reset();
    close();
    open();
  }
  size_t from = 0;
  for (std::vector<zmq::message_t> parts; recv_one(from, parts);) {
    if (parts.size() != 1) continue;
    auto parsed = parse_envelope(parts[0].data(), parts[0].size(), cluster_id_);
    if (!parsed) continue;  // noise (the coordinator's frames are well-formed)
    if (!follows(parsed.value(), from)) continue;
    const auto& body = parsed.value().body;
    if (auto* er = std::get_if<error_msg>(&body)) {
      out.push_back({control_event::kind::notice, static_cast<errc>(er->code), er->message, 0, {}});
    } else if (auto* f = std::get_if<fence_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::fence;
      ev.epoch = f->epoch;
      out.push_back(std::move(ev));
    } else if (std::holds_alternative<leave_msg>(body)) {
      control_event ev;
      ev.what = control_event::kind::leave;
      out.push_back(std::move(ev));
    } else if (auto* p = std::get_if<pin_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::pin;
      ev.round = p->round;
      ev.release = p->release;
      out.push_back(std::move(ev));
    } else if (auto* st = std::get_if<stop_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::stop;
      ev.round = st->round;
      out.push_back(std::move(ev));
    } else if (auto* w = std::get_if<welcome_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::welcome;
      ev.epoch = w->epoch;
      out.push_back(std::move(ev));
    } else if (auto* mm = std::get_if<membership_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::membership;
      ev.epoch = mm->epoch;
      ev.membership = *mm;
      out.push_back(std::move(ev));
    } else if (auto* r = std::get_if<recover_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::recover;
      ev.recover = *r;
      out.push_back(std::move(ev));
    } else if (auto* mg = std::get_if<merge_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::merge;
      ev.merge = *mg;
      out.push_back(std::move(ev));
    } else if (auto* n = std::get_if<nccl_id_msg>(&body)) {
      control_event ev;
      ev.what = control_event::kind::nccl_id;
      ev.epoch = n->epoch;
      ev.text = n->id;
      out.push_back(std::move(ev));
    }
    // Anything else (a welcome repeated for a late hello) needs no action.
  }
  out.insert(out.end(), pending_.begin(), pending_.end());  // older terms seen meanwhile
  pending_.clear();
  return out;
}

void control_client::tell_term(size_t i) {
  send_body(heartbeat_msg{0, 0, 0}, i);
}

bool control_client::follows(const envelope& e, size_t from) {
  if (e.term >= term_) {
    const auto before = leader_;
    const bool newer = e.term > term_;
    term_ = e.term;
    leader_ = from;
    // The coordinator it followed learns the newer term now (and steps down), not at a heartbeat timeout
    // of its own that would first remove every node as lost.
    if (newer && before && *before != from) tell_term(*before);
    return true;
  }
  tell_term(from);
  if (older_told_ != e.term) {
    older_told_ = e.term;
    control_event ev;
    ev.what = control_event::kind::older_coordinator;
    ev.round = e.term;
    ev.epoch = term_;
    pending_.push_back(std::move(ev));
  }
  return false;
}

std::optional<frame_result<envelope>> control_client::receive(std::chrono::milliseconds wait) {
  std::vector<zmq::pollitem_t> items;
  for (auto& l : links_) items.push_back({static_cast<void*>(*l.sock), 0, ZMQ_POLLIN, 0});
  try {
    zmq::poll(items.data(), items.size(), wait);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
  std::vector<zmq::message_t> parts;
  size_t from = 0;
  if (!recv_one(from, parts) || parts.size() != 1) return std::nullopt;
  auto parsed = parse_envelope(parts[0].data(), parts[0].size(), cluster_id_);
  if (parsed && !follows(parsed.value(), from)) return std::nullopt;
  return parsed;
}

void control_client::send(const envelope& e, std::optional<size_t> only) {
  envelope out = e;
  out.term = term_;
  const auto bytes = build_envelope(out);
  if (!only && leader_ && links_[*leader_].up) only = leader_;
  for (size_t i = 0; i < links_.size(); ++i) {
    if (only && i != *only) continue;
    auto msg = to_message(bytes);
    (void)links_[i].sock->send(msg, zmq::send_flags::dontwait);
  }
}

bool control_client::converse(const envelope& e, std::chrono::milliseconds timeout,
                              const std::function<bool(const envelope&)>& done) {
  send(e);
  auto deadline = clock::now() + timeout;
  auto next_send = clock::now() + hello_every;
  bool reached = connected_;
  while (clock::now() < deadline) {
    if (clock::now() >= next_send) {
      send(e);  // idempotent at the coordinator; also tells it that this process is still there
      next_send += hello_every;
    }
    check_handshake();
    // The time counts again from when the coordinator is first reached: a node started before it waits for
    // its answer as long as one started with it (one gave up, "cannot reach", while the coordinator waited
    // for the other nodes within its own join deadline).
    if (!reached && connected_) {
      reached = true;
      deadline = std::max(deadline, clock::now() + timeout);
    }
    auto parsed = receive(std::chrono::milliseconds(100));
    if (!parsed) continue;
    if (!*parsed) {
      if (parsed->error().reason == reject_reason::wrong_cluster)
        throw lw_error(
            errc::invalid_config,
            fmt::format("the coordinator at {} serves a different cluster (its cluster.id differs from "
                        "this cluster file's): start every role from the same cluster file",
                        endpoint_));
      continue;  // noise; keep waiting
    }
    if (done(parsed->value())) return true;
  }
  return false;
}

std::variant<welcome_msg, recover_msg> control_client::join(const hello_msg& hello,
                                                            std::chrono::milliseconds timeout) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = no_rank;
  e.body = hello;
  std::optional<std::variant<welcome_msg, recover_msg>> answer;
  const bool answered = converse(e, timeout, [&](const envelope& in) {
    const auto& body = in.body;
    if (auto* w = std::get_if<welcome_msg>(&body)) {
      if (w->rank >= w->world_size || w->peers.size() != w->world_size)
        throw lw_error(errc::malformed_frame,
                       "the coordinator's welcome is inconsistent (rank or peer list)");
      rank_ = w->rank;
      answer = *w;
    } else if (auto* r = std::get_if<recover_msg>(&body)) {
      answer = *r;
    } else if (auto* er = std::get_if<error_msg>(&body)) {
      const auto code = static_cast<errc>(er->code);
      // A hello is never answered so: this answers a join_ready sent again before it (a restarted coordinator
      // told the joiner to say hello again, twice). It was taken for the hello's, exit 2.
      if (code == errc::not_announced) return false;
      throw lw_error(code == errc::peer_lost || code == errc::cancelled ? code : errc::invalid_config,
                     fmt::format("the coordinator at {} turned this node away: {}", endpoint_, er->message));
    }
    return answer.has_value();
  });
  if (answered) return *answer;
  throw lw_error(
      errc::deadline_missed,
      fmt::format("cannot reach the coordinator at {}: no answer within {} (is `longwave coordinator` "
                  "running there, and is the address right?)",
                  endpoint_, secs(timeout)));
}

std::variant<membership_msg, recover_msg> control_client::join_ready(const join_ready_msg& ready,
                                                                     std::chrono::milliseconds timeout) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = rank_;
  e.body = ready;
  std::optional<std::variant<membership_msg, recover_msg>> answer;
  const bool answered = converse(e, timeout, [&](const envelope& in) {
    const auto& body = in.body;
    if (auto* m = std::get_if<membership_msg>(&body)) {
      rank_ = m->rank;
      answer = *m;
    } else if (auto* r = std::get_if<recover_msg>(&body)) {
      answer = *r;
    } else if (auto* er = std::get_if<error_msg>(&body)) {
      const auto code = static_cast<errc>(er->code);
      if (code != errc::none)
        throw lw_error(
            code == errc::invalid_config || code == errc::cancelled || code == errc::not_announced
                ? code
                : errc::peer_lost,
            fmt::format("the coordinator at {} did not admit this node: {}", endpoint_, er->message));
    }
    return answer.has_value();
  });
  if (answered) return *answer;
  throw lw_error(errc::deadline_missed, fmt::format("the coordinator at {} did not admit this node within {}",
                                                    endpoint_, secs(timeout)));
}

void control_client::heartbeat(uint64_t round, uint64_t epoch) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = rank_;
  e.body = heartbeat_msg{round,
                         static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   std::chrono::system_clock::now().time_since_epoch())
                                                   .count()),
                         epoch};
  send(e);
}

void control_client::starting() {
  send_body(heartbeat_msg{0, 0, 0, true});
}

std::pair<errc, std::string> control_client::request_leave(const std::string& name,
                                                           std::chrono::milliseconds timeout) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = no_rank;
  e.body = leave_msg{name};
  send(e);
  const auto deadline = clock::now() + timeout;
  while (clock::now() < deadline) {
    check_handshake();
    auto parsed = receive(std::chrono::milliseconds(100));
    if (!parsed) continue;
    if (!*parsed) {
      if (parsed->error().reason == reject_reason::wrong_cluster)
        return {errc::invalid_config, "the coordinator at " + endpoint_ + " serves a different cluster"};
      continue;
    }
    if (auto* er = std::get_if<error_msg>(&parsed->value().body))
      return {static_cast<errc>(er->code), er->message};
  }
  throw lw_error(errc::deadline_missed, fmt::format("cannot reach the coordinator at {}: no answer within {}",
                                                    endpoint_, secs(timeout)));
}

std::pair<errc, std::string> control_client::request_stop(std::chrono::milliseconds timeout) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = no_rank;
  e.body = stop_msg{0};
  std::optional<std::pair<errc, std::string>> answer;
  const bool answered = converse(e, timeout, [&](const envelope& in) {
    if (auto* er = std::get_if<error_msg>(&in.body)) answer = {static_cast<errc>(er->code), er->message};
    return answer.has_value();
  });
  if (answered) return *answer;
  throw lw_error(errc::deadline_missed, fmt::format("cannot reach the coordinator at {}: no answer within {}",
                                                    endpoint_, secs(timeout)));
}

std::pair<errc, std::string> control_client::wait_stopped(
    std::chrono::milliseconds silence, const std::function<void(const std::string&)>& progress) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = no_rank;
  e.body = stop_msg{0};
  auto heard = clock::now();
  auto next_send = heard;
  while (clock::now() - heard < silence) {
    if (clock::now() >= next_send) {
      send(e);  // the coordinator answers "already stopping", and a restarted one learns of the stop
      next_send = clock::now() + hello_every;
    }
    check_handshake();
    auto parsed = receive(std::chrono::milliseconds(100));
    if (!parsed || !*parsed) continue;
    const auto& body = parsed->value().body;
    if (auto* b = std::get_if<bye_msg>(&body)) return {errc::none, b->reason};
    if (auto* er = std::get_if<error_msg>(&body)) {
      heard = clock::now();
      if (er->code != static_cast<uint16_t>(errc::none)) return {static_cast<errc>(er->code), er->message};
      if (progress) progress(er->message);
    }
  }
  throw lw_error(errc::deadline_missed,
                 fmt::format("the coordinator at {} went silent for {} before it said the cluster stopped "
                             "(it was killed, or its machine is unreachable): see its log",
                             endpoint_, secs(silence)));
}

void control_client::pin_ack(uint64_t round) {
  send_body(pin_msg{round, false});
}

void control_client::stop_ack(uint64_t round) {
  send_body(stop_msg{round, /*answer=*/true});
}

void control_client::nccl_id(uint64_t epoch, const std::string& id) {
  send_body(nccl_id_msg{epoch, id});
}

std::string control_client::wait_nccl_id(uint64_t epoch, std::chrono::milliseconds timeout) {
  // Not a heartbeat, which would say that its main loop runs: a start-up beat.
  const auto deadline = clock::now() + timeout;
  std::vector<control_event> kept;
  auto beat = clock::time_point{};
  for (;;) {
    if (clock::now() - beat >= std::chrono::seconds(2)) {
      beat = clock::now();
      starting();
    }
    for (auto& ev : poll()) {
      if (ev.what == control_event::kind::nccl_id && ev.epoch == epoch) {
        pending_.insert(pending_.begin(), kept.begin(), kept.end());
        return ev.text;
      }
      kept.push_back(std::move(ev));
    }
    if (clock::now() >= deadline) {
      pending_.insert(pending_.begin(), kept.begin(), kept.end());
      throw lw_error(
          errc::peer_lost,
          fmt::format("no NCCL id for epoch {} came from its rank 0 within {} (through the coordinator "
                      "at {})",
                      epoch, secs(timeout), endpoint_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void control_client::contribute(const contribute_msg& c) {
  send_body(c);
}

void control_client::committed(uint64_t round, uint32_t theta_crc) {
  send_body(committed_msg{round, theta_crc});
}

void control_client::send_body(decltype(envelope::body) body, std::optional<size_t> only) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = rank_;
  e.body = std::move(body);
  send(e, only);
}

void control_client::reannounce(const hello_msg& hello) {
  send_body(hello);
}

void control_client::fence_ack(const fence_ack_msg& ack) {
  send_body(ack);
}

void control_client::ring_failed(const ring_failed_msg& failure) {
  ring_failed_msg f = failure;
  f.suspect = f.suspect.substr(0, max_name_bytes);
  f.reason = f.reason.substr(0, max_message_bytes);
  send_body(std::move(f));
}

void control_client::bye(const std::string& reason) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = rank_;
  e.body = bye_msg{reason.substr(0, max_message_bytes)};
  send(e);
}

void control_client::error(errc code, const std::string& message) {
  envelope e;
  e.cluster_id = cluster_id_;
  e.sender = rank_;
  e.body = error_msg{static_cast<uint16_t>(code), message.substr(0, max_message_bytes)};
  send(e);
}

}  // namespace longwave::cluster
