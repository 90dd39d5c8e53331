#include "comm/deferred_collective.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "runtime/errors/errors.hpp"

namespace longwave::comm {

void epoch_keys::put(uint64_t epoch, std::string key) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    keys_[epoch] = std::move(key);
  }
  cv_.notify_all();
}

std::optional<std::string> epoch_keys::wait(uint64_t epoch, std::chrono::milliseconds timeout,
                                            const std::atomic<bool>& stop) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    keys_.erase(keys_.begin(), keys_.lower_bound(epoch));  // earlier epochs' keys are of no use any more
    if (const auto it = keys_.find(epoch); it != keys_.end()) return it->second;
    if (stop.load() || std::chrono::steady_clock::now() >= until) return std::nullopt;
    cv_.wait_until(lock, std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  }
}

deferred_collective::deferred_collective(int rank, int world, uint64_t epoch, const char* backend,
                                         size_t chunk_elements, std::shared_ptr<epoch_keys> keys,
                                         make_fn make, std::chrono::milliseconds key_timeout)
    : rank_(rank),
      world_(world),
      epoch_(epoch),
      backend_(backend),
      chunk_elements_(chunk_elements),
      keys_(std::move(keys)),
      make_(std::move(make)),
      key_timeout_(key_timeout) {}

collective& deferred_collective::backend() {
  if (auto b = made_backend()) return *b;
  const auto key = keys_->wait(epoch_, key_timeout_, cancelled_);
  if (cancelled_.load()) throw lw_error(errc::cancelled, "collective cancelled");
  if (!key)
    throw lw_error(errc::peer_lost,
                   fmt::format("epoch {}'s {} communicator: its key from rank 0 did not come "
                               "within {} s",
                               epoch_, backend_, key_timeout_.count() / 1000));
  // NCCL: until every member has joined, polling abandon.
  auto made = make_(*key, [this] {
    if (cancelled_.load()) throw lw_error(errc::cancelled, "collective cancelled while its members joined");
  });
  if (!made)
    throw lw_error(errc::peer_lost, fmt::format("epoch {}'s {} communicator was not made", epoch_, backend_));
  const std::lock_guard<std::mutex> lock(mu_);
  inner_ = std::move(made);
  if (cancelled_.load()) inner_->cancel();  // cancelled while it was being made
  if (!verdict_.empty()) inner_->peer_declared_lost(verdict_);
  return *inner_;
}

std::shared_ptr<collective> deferred_collective::made_backend() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return inner_;
}

bool deferred_collective::made() const {
  return made_backend() != nullptr;
}

void deferred_collective::allreduce(uint64_t round, float* data, size_t n, double weight, uint32_t fragment,
                                    std::optional<wire_dtype> dtype) {
  backend().allreduce(round, data, n, weight, fragment, dtype);
}

gathered deferred_collective::allgather(uint64_t round, const std::byte* message, size_t bytes, double weight,
                                        uint32_t fragment) {
  return backend().allgather(round, message, bytes, weight, fragment);
}

void deferred_collective::cancel() {
  cancelled_ = true;
  if (auto b = made_backend()) b->cancel();
}

void deferred_collective::peer_declared_lost(const std::string& verdict) {
  std::shared_ptr<collective> b;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    verdict_ = verdict;
    b = inner_;
  }
  if (b) b->peer_declared_lost(verdict);
}

uint64_t deferred_collective::completed_round() const {
  return of(&collective::completed_round);
}

double deferred_collective::last_total_weight() const {
  return of(&collective::last_total_weight);
}

uint64_t deferred_collective::bytes_sent() const {
  return of(&collective::bytes_sent);
}

uint64_t deferred_collective::bytes_received() const {
  return of(&collective::bytes_received);
}

double deferred_collective::encode_seconds() const {
  return of(&collective::encode_seconds);
}

double deferred_collective::decode_seconds() const {
  return of(&collective::decode_seconds);
}

}  // namespace longwave::comm
