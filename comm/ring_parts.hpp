#pragma once
// ring_allreduce's private parts, shared by its calls (ring_allreduce.cpp) and its event loop
// (ring_round.cpp): the counters, a frame held for a later round, and what a call does with its payloads.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "comm/ring_allreduce.hpp"
#include "comm/ring_plan.hpp"

namespace longwave::comm {

struct ring_allreduce::counters {
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> encode_ns{0};
  std::atomic<uint64_t> decode_ns{0};
  std::atomic<uint64_t> send_wait_ns{0};  // in wait() with a chunk the next rank's queue would not take
  std::atomic<uint64_t> recv_wait_ns{0};  // in wait() for the previous rank's next chunk
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> completed_round{0};
  std::atomic<double> total_weight{0};  // of the last call: every rank's weight summed
  int logged = 0;                       // I/O thread
  mutable std::mutex verdict_mu;
  std::optional<std::string> verdict;  // from peer_declared_lost; under verdict_mu
};

struct ring_allreduce::held_frame {
  chunk_header header;
  zmq::message_t payload;
  std::string peer;
};

// What a call does with its plan's payloads; run_round's loop does the rest (validation, sending, holding,
// forwarding, deadlines), the same for the all-reduce and the all-gather.
struct ring_allreduce::round_ops {
  // Takes the payload of in item i, already validated against the plan (decode, reduce or copy it); a
  // rejection drops the frame instead.
  std::function<std::optional<rejection>(size_t i, const chunk_header& h, const zmq::message_t& payload)>
      take;
  // Builds the payload of out item i, which forwards nothing, and sets h's weight and checksum.
  std::function<void(size_t i, chunk_header& h, zmq::message_t& payload)> make;
};

}  // namespace longwave::comm
