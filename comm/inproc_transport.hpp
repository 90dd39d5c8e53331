#pragma once
// Ring links inside one process, for tests and benches: a hub of named mailboxes, one per bound endpoint
// (any string, e.g. "r0"), with ZeroMQ's semantics where the ring relies on them: per-link high-water marks,
// a next rank that may bind later (frames wait for it), a lost link when it goes away, frames lingering at
// close. Each member keeps its own I/O thread, as with ZeroMQ. A link can be cut and healed (a partition).
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport.hpp"

namespace longwave::comm {

class inproc_hub : public std::enable_shared_from_this<inproc_hub> {
 public:
  static std::shared_ptr<inproc_hub> make() { return std::shared_ptr<inproc_hub>(new inproc_hub()); }

  /// A factory for ring_options::transport whose members meet in this hub (CURVE options are ignored).
  transport_factory factory();

  /// Cuts the link from endpoint `from` to endpoint `to`: frames queued on it are dropped and its sender
  /// sees link_lost() until heal(). Any thread.
  void cut(const std::string& from, const std::string& to);
  void heal(const std::string& from, const std::string& to);

 private:
  friend class inproc_transport;
  inproc_hub() = default;

  struct message {
    std::vector<zmq::message_t> parts;
    std::string from;
  };
  struct mailbox {
    std::deque<message> queue;
    size_t hwm = 64;
    int64_t max_bytes = -1;
    uint64_t generation = 0;  // a fresh bind of the same endpoint is another peer
  };

  std::mutex mu_;
  std::condition_variable cv_;  // any mailbox or link changed
  std::map<std::string, mailbox> boxes_;
  std::set<std::pair<std::string, std::string>> cut_;
  uint64_t generations_ = 0;
};

}  // namespace longwave::comm
