// The fault decorator: counts this node's chunks by the round in their header (comm/frame.hpp), and meters
// the bytes handed to the next rank.
#include "comm/fault_transport.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "comm/frame.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {
namespace {

using clock = std::chrono::steady_clock;

// What a link carries per byte of a frame over TCP/IPv4 on Ethernet: 66 header bytes (Ethernet 14, IP 20,
// TCP 32 with timestamps) per 1448-byte segment. tc tbf meters those bytes too (bench/rate_limit.sh compares
// the two).
constexpr double link_bytes_per_byte = 1514.0 / 1448.0;

class fault_transport final : public transport {
 public:
  fault_transport(std::unique_ptr<transport> inner, transport_faults f)
      : inner_(std::move(inner)), f_(f), tokens_(bucket()), last_refill_(clock::now()) {}

  std::future<void> submit(std::function<void()> fn) override { return inner_->submit(std::move(fn)); }
  bool stopping() const override { return inner_->stopping(); }
  void drop_queued_on_close() override { inner_->drop_queued_on_close(); }
  const std::string& bound_endpoint() const override { return inner_->bound_endpoint(); }
  bool try_recv(inbound_message& out, size_t max_parts) override { return inner_->try_recv(out, max_parts); }
  std::optional<std::string> link_lost() override { return inner_->link_lost(); }

  bool try_send(zmq::message_t& header, zmq::message_t& payload) override {
    const size_t bytes = header.size() + payload.size();
    const double cost = static_cast<double>(bytes) * link_bytes_per_byte;
    if (f_.send_bytes_per_s > 0 && !refill(cost)) return false;
    // The round a chunk belongs to is read before the send takes the header away.
    std::optional<chunk_header> h;
    if (f_.die_in_round != 0 || f_.gate_round != 0)
      if (auto parsed = parse_chunk_header(header.data(), header.size())) h = parsed.value();
    gated_ = false;  // a frame of another round does not wait (the gated one may have been abandoned)
    if (f_.gate_round != 0 && h && h->round == f_.gate_round && !gate_open()) return false;
    if (!inner_->try_send(header, payload)) return false;
    if (f_.send_bytes_per_s > 0) tokens_ -= cost;
    if (h) count(*h);
    return true;
  }

  void wait(bool want_send, bool want_recv, clock::time_point until) override {
    if (want_send && gated_) {  // look for the gate's file again soon
      inner_->wait(false, want_recv, std::min(until, clock::now() + std::chrono::milliseconds(20)));
      return;
    }
    if (want_send && f_.send_bytes_per_s > 0 && waiting_ > 0 && !refill(waiting_)) {
      // The frame that did not go waits until the link would have carried it.
      const auto carried =
          clock::now() + std::chrono::duration_cast<clock::duration>(
                             std::chrono::duration<double>((waiting_ - tokens_) / f_.send_bytes_per_s));
      inner_->wait(false, want_recv, std::min(until, carried));
      return;
    }
    inner_->wait(want_send, want_recv, until);
  }

 private:
  // The burst after an idle spell: tc tbf's in scripts/wan (256 KiB).
  static constexpr double bucket() { return 256.0 * 1024; }

  // Adds the tokens earned since the last call: up to the bucket while idle, up to a waiting frame's bytes
  // while it waits. True when the frame of `bytes` may go: the link would have carried it by now (a frame
  // leaves after its transmission time, as from a real link, not before it).
  bool refill(double bytes) {
    const auto now = clock::now();
    const double earned = std::chrono::duration<double>(now - last_refill_).count() * f_.send_bytes_per_s;
    tokens_ = std::min(tokens_ + earned, std::max(bucket(), bytes));
    last_refill_ = now;
    waiting_ = tokens_ >= bytes ? 0 : bytes;
    return waiting_ == 0;
  }

  // Whether the gate's file exists; said once when a frame first waits for it.
  bool gate_open() {
    std::error_code ec;
    gated_ = !std::filesystem::exists(f_.gate_path, ec);
    if (gated_ && !said_gate_) {
      said_gate_ = true;
      std::fprintf(stderr, "longwave comm: LONGWAVE_FAULT_ALLREDUCE_GATE: round %llu's frames wait for %s\n",
                   static_cast<unsigned long long>(f_.gate_round), f_.gate_path.c_str());
    }
    if (!gated_) f_.gate_round = 0;  // open for good
    return !gated_;
  }

  void count(const chunk_header& h) {
    if (h.round != f_.die_in_round) return;
    const std::pair<uint64_t, uint32_t> call{h.round, h.fragment};
    if (call != call_) {  // a new call (a fragment of a streaming round): count afresh
      call_ = call;
      sent_ = 0;
    }
    if (++sent_ != f_.die_after_chunks) return;
    if (f_.hang) {
      std::fprintf(stderr, "longwave comm: LONGWAVE_FAULT_DIE_IN_ALLREDUCE: the ring hangs here\n");
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the frames leave this process
    std::raise(SIGKILL);
  }

  std::unique_ptr<transport> inner_;
  transport_faults f_;
  double tokens_;
  double waiting_ = 0;  // bytes of the frame that did not go (0: none)
  clock::time_point last_refill_;
  bool gated_ = false, said_gate_ = false;
  std::pair<uint64_t, uint32_t> call_{0, 0};
  size_t sent_ = 0;
};

}  // namespace

transport_factory with_faults(transport_factory inner, transport_faults faults) {
  return [inner = std::move(inner), faults](transport_options opts) -> std::unique_ptr<transport> {
    auto t = inner ? inner(std::move(opts)) : make_zmq_transport(std::move(opts));
    return std::make_unique<fault_transport>(std::move(t), faults);
  };
}

std::optional<transport_faults> transport_faults_from_env() {
  const char* die = std::getenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE");
  const char* rate = std::getenv("LONGWAVE_FAULT_RING_RATE");
  const char* gate = std::getenv("LONGWAVE_FAULT_ALLREDUCE_GATE");
  const auto unset = [](const char* v) { return v == nullptr || *v == '\0'; };
  if (unset(die) && unset(rate) && unset(gate)) return std::nullopt;
  transport_faults f;
  if (!unset(gate)) {
    unsigned long long r = 0;
    int used = 0;
    if (std::sscanf(gate, "%llu:%n", &r, &used) != 1 || used == 0 || r == 0 || gate[used] == '\0')
      throw lw_error(errc::invalid_config,
                     fmt::format("LONGWAVE_FAULT_ALLREDUCE_GATE={}: want ROUND:PATH, ROUND positive", gate));
    f.gate_round = r;
    f.gate_path = gate + used;
  }
  if (die != nullptr && *die != '\0') {
    unsigned long long r = 0, c = 0;
    int used = 0;
    const int got = std::sscanf(die, "%llu:%llu%n", &r, &c, &used);
    const std::string rest = got == 2 ? die + used : "";
    if (got != 2 || r == 0 || c == 0 || (!rest.empty() && rest != ":hang"))
      throw lw_error(
          errc::invalid_config,
          fmt::format("LONGWAVE_FAULT_DIE_IN_ALLREDUCE={}: want ROUND:CHUNKS[:hang], both positive", die));
    f.die_in_round = r;
    f.die_after_chunks = c;
    f.hang = rest == ":hang";
  }
  if (rate != nullptr && *rate != '\0') {
    char* end = nullptr;
    const double v = std::strtod(rate, &end);
    if (end == rate || *end != '\0' || !(v > 0) || !std::isfinite(v))
      throw lw_error(
          errc::invalid_config,
          fmt::format("LONGWAVE_FAULT_RING_RATE={}: want a positive number of bytes per second", rate));
    f.send_bytes_per_s = v;
  }
  return f;
}

}  // namespace longwave::comm
