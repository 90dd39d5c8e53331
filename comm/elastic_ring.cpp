// The ring of a cluster with changing membership (see elastic_ring.hpp).
#include "comm/elastic_ring.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace longwave::comm {

namespace {

/// The ring key of a main all-reduce and of its confirmation: both increase from call to call.
uint32_t main_fragment(uint32_t fragment) {
  return fragment * 2;
}
uint32_t confirm_fragment(uint32_t fragment) {
  return fragment * 2 + 1;
}

}  // namespace

elastic_ring::elastic_ring(epoch_view first, ring_options opts, ring_allreduce::reject_callback on_reject,
                           reduce_key committed)
    : make_([this, opts, on_reject = std::move(on_reject)](const epoch_view& v) {
        auto o = opts;
        if (o.on_stall)  // a stalled confirmation says that this node holds the result
          o.on_stall = [this, say = o.on_stall](const std::string& line) {
            say(confirming_.load() ? line +
                                         "; this node holds the all-reduce's result, waiting for the "
                                         "members' confirmation"
                                   : line);
          };
        o.epoch = v.epoch;
        o.names = v.names;
        o.public_keys = v.public_keys;
        return std::make_shared<ring_allreduce>(static_cast<int>(v.rank), v.endpoints, o, on_reject);
      }),
      timeout_(opts.timeout),
      view_(std::move(first)) {
  start(committed);
}

elastic_ring::elastic_ring(epoch_view first, epoch_factory make, std::chrono::milliseconds timeout,
                           reduce_key committed)
    : make_(std::move(make)), timeout_(timeout), view_(std::move(first)) {
  start(committed);
}

void elastic_ring::start(reduce_key committed) {
  committed_ = committed;
  if (view_.names.size() != view_.endpoints.size() || view_.rank >= view_.endpoints.size())
    throw lw_error(errc::invalid_config, "elastic_ring: rank or member lists disagree");
  std::lock_guard<std::mutex> lk(mu_);
  build_ring();
  if (evicted_) throw lw_error(errc::io_error, *evicted_);
  chunk_elements_ = ring_->chunk_elements();
  backend_ = ring_->backend_name();
}

elastic_ring::~elastic_ring() {
  std::lock_guard<std::mutex> lk(mu_);
  ring_.reset();
}

void elastic_ring::build_ring() {
  try {
    ring_ = make_(view_);
  } catch (const lw_error& e) {
    ring_.reset();
    evicted_ = fmt::format("cannot start the ring of epoch {}: {}", view_.epoch, e.what());
    cv_.notify_all();
  }
}

void elastic_ring::retire_ring() {
  if (!ring_) return;
  sent_ += ring_->bytes_sent();
  received_ += ring_->bytes_received();
  encode_s_ += ring_->encode_seconds();
  decode_s_ += ring_->decode_seconds();
  send_wait_s_ += ring_->send_wait_seconds();
  receive_wait_s_ += ring_->receive_wait_seconds();
  ring_->cancel();  // nothing more goes out: the destructor does not wait for the next rank
  ring_.reset();
}

elastic_ring::outcome elastic_ring::attempt(const reduce_key& key, const main_call& main, std::string& error,
                                            errc& code) {
  const auto began = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  auto ring = ring_;
  const uint64_t epoch = view_.epoch;
  auto names = view_.names;
  in_call_ = true;
  lk.unlock();
  bool ok = true;
  try {
    if (!ring) throw lw_error(errc::peer_lost, "no ring in epoch " + std::to_string(epoch));
    main(*ring, main_fragment(key.fragment));
    const double total = ring->last_total_weight();  // before the confirmation's weights replace it
    lk.lock();
    have_result_ = true;
    result_total_ = total;  // what last_total_weight() says if a membership change keeps this result
    result_members_ = std::move(names);
    lk.unlock();
    // Nobody applies a result before every member holds it: a member that fails before this point makes
    // every member redo the main call, and none has applied it yet. The confirmation carries each rank's
    // note in its own slots, so every member learns every other's.
    confirming_.store(true);
    auto notes = confirm(*ring, key);
    confirming_.store(false);
    lk.lock();
    notes_ = std::move(notes);
    lk.unlock();
    total_weight_.store(total);
  } catch (const lw_error& e) {
    ok = false;
    error = e.what();
    code = e.code();
  }
  confirming_.store(false);
  if (!lk.owns_lock()) lk.lock();
  in_call_ = false;
  cv_.notify_all();
  if (ok) return outcome::done;
  if (cancelled_ || evicted_ || fenced_ || view_.epoch != epoch) return outcome::parked;
  // A failure the coordinator has not fenced (yet): it hears of it from the node's main thread.
  ring_failure f;
  f.epoch = epoch;
  f.reason = error;
  f.began = began;
  if (code == errc::peer_lost && view_.endpoints.size() > 1)
    f.suspect = view_.names[(view_.rank + 1) % view_.names.size()];
  failure_ = std::move(f);
  return outcome::failed;
}

std::vector<rank_note> elastic_ring::confirm(collective& ring, const reduce_key& key) {
  const auto world = static_cast<size_t>(ring.world_size());
  const auto me = static_cast<size_t>(ring.rank());
  std::unique_lock<std::mutex> lk(mu_);
  const rank_note mine = note_;
  lk.unlock();
  if (world == 1) return {mine};
  // Two slots a rank, zero but its own: the mean of equal weights is then each rank's note / world.
  std::vector<float> slots(2 * world, 0.0f);
  slots[2 * me] = mine.contributors;
  slots[2 * me + 1] = mine.step_seconds;
  ring.allreduce(key.round, slots.data(), slots.size(), 1.0, confirm_fragment(key.fragment),
                 wire_dtype::fp32);
  std::vector<rank_note> notes(world);
  const auto w = static_cast<float>(world);
  for (size_t r = 0; r < world; ++r) notes[r] = {slots[2 * r] * w, slots[2 * r + 1] * w};
  return notes;
}

std::vector<std::string> elastic_ring::last_members() const {
  std::lock_guard<std::mutex> lk(mu_);
  return members_;
}

void elastic_ring::set_note(const rank_note& note) {
  std::lock_guard<std::mutex> lk(mu_);
  note_ = note;
}

std::vector<rank_note> elastic_ring::notes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return notes_;
}

void elastic_ring::run(const reduce_key& key, const main_call& main, const std::function<void()>& restore) {
  std::unique_lock<std::mutex> lk(mu_);
  pending_ = key;
  have_result_ = false;
  entered_ = false;
  auto finish = [&] {
    pending_.reset();
    have_result_ = false;
    entered_ = false;
  };
  for (;;) {
    cv_.wait(lk, [&] { return cancelled_ || evicted_ || !fenced_; });
    if (cancelled_) {
      finish();
      throw lw_error(errc::cancelled, "ring call cancelled");
    }
    if (evicted_) {
      finish();
      throw lw_error(errc::peer_lost, *evicted_);
    }
    if (entered_) {
      // Back from a membership change: keep the result every member holds, else redo from the input.
      entered_ = false;
      if (have_result_ && commit_ && *commit_ == key) {
        committed_ = key;
        total_weight_.store(result_total_);
        members_ = result_members_;
        finish();
        return;
      }
      restore();
      have_result_ = false;
    }
    lk.unlock();
    std::string error;
    errc code = errc::none;
    const auto result = attempt(key, main, error, code);
    lk.lock();
    if (result == outcome::done) {
      committed_ = key;
      members_ = result_members_;
      finish();
      return;
    }
    if (result == outcome::failed) {
      const uint64_t epoch = view_.epoch;
      const bool answered = cv_.wait_for(
          lk, timeout_, [&] { return cancelled_ || evicted_ || fenced_ || view_.epoch != epoch; });
      if (!answered) {
        finish();
        throw lw_error(code,
                       error + " (and the coordinator changed no membership within the ring's timeout)");
      }
    }
  }
}

void elastic_ring::allreduce(uint64_t round, float* data, size_t n, double weight, uint32_t fragment,
                             std::optional<wire_dtype> dtype) {
  // The input, for a redo among other members; the buffer is kept between calls (calls are serialized), so
  // that the copy costs no page faults.
  if (input_.size() < n) input_.resize(n);
  std::copy(data, data + n, input_.begin());
  run(
      reduce_key{round, fragment},
      [&](collective& ring, uint32_t f) {
        ring.allreduce(round, data, n, weight == rank0_weight ? (ring.rank() == 0 ? 1.0 : 0.0) : weight, f,
                       dtype);
      },
      [&] { std::copy(input_.begin(), input_.begin() + static_cast<std::ptrdiff_t>(n), data); });
}

gathered elastic_ring::allgather(uint64_t round, const std::byte* message, size_t bytes, double weight,
                                 uint32_t fragment) {
  // The caller's message is the kept input: it is const and outlives this blocking call, so a redo resends
  // it unchanged and nothing needs restoring. The kept result is the last main call's.
  gathered result;
  run(
      reduce_key{round, fragment},
      [&](collective& ring, uint32_t f) { result = ring.allgather(round, message, bytes, weight, f); },
      [] {});
  return result;
}

void elastic_ring::cancel() {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_ = true;
  if (ring_) ring_->cancel();
  cv_.notify_all();
}

void elastic_ring::peer_declared_lost(const std::string& verdict) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ring_) ring_->peer_declared_lost(verdict);
}

void elastic_ring::fence(uint64_t epoch) {
  std::lock_guard<std::mutex> lk(mu_);
  if (epoch <= view_.epoch) return;  // an old fence, already entered
  if (fenced_ && epoch == fence_epoch_) {
    reported_ = false;  // asked again (an answer may have been lost): report again
    return;
  }
  fenced_ = true;
  fence_epoch_ = std::max(fence_epoch_, epoch);
  reported_ = false;
  if (ring_) ring_->cancel();  // the call in flight ends within about 50 ms
  cv_.notify_all();
}

std::optional<fence_state> elastic_ring::fence_report() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!fenced_ || reported_ || in_call_) return std::nullopt;
  reported_ = true;
  // Closed before the coordinator hears this, so that no member of the next epoch connects to this node's
  // old socket (whose closing would then fail its fresh ring).
  retire_ring();
  fence_state a;
  a.epoch = fence_epoch_;
  a.committed = committed_;
  a.has_pending = pending_.has_value();
  if (pending_) a.pending = *pending_;
  a.have_result = pending_ && have_result_;
  return a;
}

void elastic_ring::enter(const epoch_view& next, reduce_key commit) {
  std::unique_lock<std::mutex> lk(mu_);
  if (next.epoch <= view_.epoch || next.rank >= next.endpoints.size() ||
      next.names.size() != next.endpoints.size())
    return;
  if (in_call_) {  // a membership without its fence (e.g. the fence was lost): abandon the call first
    fenced_ = true;
    if (ring_) ring_->cancel();
    cv_.wait(lk, [&] { return !in_call_; });
  }
  retire_ring();
  view_ = next;
  build_ring();
  fenced_ = false;
  reported_ = false;
  failure_.reset();
  fence_epoch_ = std::max(fence_epoch_, next.epoch);
  if (pending_) {
    commit_ = commit;
    entered_ = true;
  }
  cv_.notify_all();
}

void elastic_ring::evict(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!evicted_) evicted_ = why;
  if (ring_) ring_->cancel();
  cv_.notify_all();
}

std::optional<ring_failure> elastic_ring::take_failure() {
  std::lock_guard<std::mutex> lk(mu_);
  auto f = std::move(failure_);
  failure_.reset();
  return f;
}

uint64_t elastic_ring::epoch() const {
  std::lock_guard<std::mutex> lk(mu_);
  return view_.epoch;
}

bool elastic_ring::fenced() const {
  std::lock_guard<std::mutex> lk(mu_);
  return fenced_;
}

std::optional<reduce_key> elastic_ring::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_;
}

reduce_key elastic_ring::committed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return committed_;
}

uint64_t elastic_ring::completed_round() const {
  return committed().round;
}

uint64_t elastic_ring::bytes_sent() const {
  std::lock_guard<std::mutex> lk(mu_);
  return sent_ + (ring_ ? ring_->bytes_sent() : 0);
}

uint64_t elastic_ring::bytes_received() const {
  std::lock_guard<std::mutex> lk(mu_);
  return received_ + (ring_ ? ring_->bytes_received() : 0);
}

double elastic_ring::encode_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return encode_s_ + (ring_ ? ring_->encode_seconds() : 0);
}

double elastic_ring::decode_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return decode_s_ + (ring_ ? ring_->decode_seconds() : 0);
}

double elastic_ring::send_wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return send_wait_s_ + (ring_ ? ring_->send_wait_seconds() : 0);
}

double elastic_ring::receive_wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return receive_wait_s_ + (ring_ ? ring_->receive_wait_seconds() : 0);
}

size_t elastic_ring::chunk_elements() const {
  return chunk_elements_;  // the same options in every epoch
}

int elastic_ring::rank() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(view_.rank);
}

int elastic_ring::world_size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(view_.endpoints.size());
}

}  // namespace longwave::comm
