#pragma once
// An epoch's collective made at its first call, on the caller's (the communicator's) thread, from a key
// that may still be on its way: NCCL's communicator of a new epoch, whose unique id the epoch's rank 0 makes
// and the control plane brings to the others, and whose creation blocks until every member has joined.
// elastic_ring's factory runs on the node's main thread, which must keep ticking meanwhile.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/collective.hpp"

namespace longwave::comm {

/// Each epoch's key (NCCL's unique id), put by whoever has it (rank 0 itself; the control plane's event
/// for the others) and taken by that epoch's collective. Thread-safe.
class epoch_keys {
 public:
  void put(uint64_t epoch, std::string key);
  /// The key of `epoch`, waiting up to `timeout`; nullopt when it did not come or `stop` became true (checked
  /// every 50 ms). Keys of earlier epochs are dropped.
  std::optional<std::string> wait(uint64_t epoch, std::chrono::milliseconds timeout,
                                  const std::atomic<bool>& stop);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::string> keys_;
};

/// A collective of `world` ranks that makes its backend (make(key, abandon)) at the first call, once
/// `epoch`'s key is in `keys`. cancel() before then ends the wait (errc::cancelled), and while the backend is
/// being made, `abandon` throws errc::cancelled once cancel() came (make calls it while it waits for the
/// other members). A key that does not come within `key_timeout` fails the call with peer_lost naming the
/// epoch. Counters are 0 until the backend exists.
class deferred_collective final : public collective {
 public:
  using make_fn = std::function<std::shared_ptr<collective>(const std::string& key,
                                                            const std::function<void()>& abandon)>;

  deferred_collective(int rank, int world, uint64_t epoch, const char* backend, size_t chunk_elements,
                      std::shared_ptr<epoch_keys> keys, make_fn make, std::chrono::milliseconds key_timeout);

  void allreduce(uint64_t round, float* data, size_t n, double weight = 1.0, uint32_t fragment = 0,
                 std::optional<wire_dtype> dtype = std::nullopt) override;
  gathered allgather(uint64_t round, const std::byte* message, size_t bytes, double weight = 1.0,
                     uint32_t fragment = 0) override;
  void cancel() override;
  void peer_declared_lost(const std::string& verdict) override;

  uint64_t completed_round() const override;
  double last_total_weight() const override;
  uint64_t bytes_sent() const override;
  uint64_t bytes_received() const override;
  double encode_seconds() const override;
  double decode_seconds() const override;
  size_t chunk_elements() const override { return chunk_elements_; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend_name() const override { return backend_; }

  /// Whether the backend exists (its first call got the key and made it).
  bool made() const;

 private:
  /// The backend, made on the first call.
  collective& backend();
  std::shared_ptr<collective> made_backend() const;
  /// A counter of the backend; 0 before it exists.
  template <class T>
  T of(T (collective::*counter)() const) const {
    const auto b = made_backend();
    return b ? ((*b).*counter)() : T{};
  }

  int rank_, world_;
  uint64_t epoch_;
  const char* backend_;
  size_t chunk_elements_;
  std::shared_ptr<epoch_keys> keys_;
  make_fn make_;
  std::chrono::milliseconds key_timeout_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::shared_ptr<collective> inner_;  // under mu_
  std::string verdict_;                // a peer_declared_lost before the backend existed (under mu_)
};

}  // namespace longwave::comm
