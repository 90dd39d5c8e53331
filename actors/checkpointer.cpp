// Checkpointer actor: one detached thread owning the checkpoint_store; saves are processed in order.
#include "actors/checkpointer.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime/errors/fault_env.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/log/log.hpp"
#include "runtime/memory/allocator.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct checkpointer_state {
  std::unique_ptr<checkpoint_store> store;
  snapshot_shape shape;
  std::function<std::string()> lock_lost;
  // LONGWAVE_FAULT_SLOW_CHECKPOINT_S (tests): the first write takes this long more.
  double slow_first_write_s = 0;
  size_t resident_after_trim = 0;  // the process's resident bytes after its last release_freed_memory
};

/// The freed blocks that keep_freed_buffers keeps pile up over rounds in the threads' arenas (a single run
/// of the tiny model: +100 MB over 450 rounds). A checkpoint hands them back once resident memory has grown
/// by trim_growth since the last time: rarely, as the next rounds fault the pages in again.
constexpr size_t trim_growth = size_t{64} << 20;

void trim_if_grown(checkpointer_state& s) {
  const size_t now = runtime::resident_bytes();
  if (now == 0 || (s.resident_after_trim != 0 && now < s.resident_after_trim + trim_growth)) return;
  (void)runtime::release_freed_memory();  // the first checkpoint's sets the mark
  s.resident_after_trim = runtime::resident_bytes();
}

/// Says in the log, once a minute, that a write is still running (a slow or hung disk, a suspended process):
/// the run waits for its checkpoint rather than give up on a write that may still land.
class slow_write_watch {
 public:
  slow_write_watch(uint64_t round, std::string dir) {
    thread_ = std::thread([this, round, dir = std::move(dir)] {
      const auto t0 = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::minutes(1), [this] { return done_; }))
        spdlog::warn(
            "checkpoint of round {}: still writing into {} after {:.0f} s (a slow disk, or was this process "
            "stopped?)",
            round, dir, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    });
  }
  ~slow_write_watch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  slow_write_watch(const slow_write_watch&) = delete;
  slow_write_watch& operator=(const slow_write_watch&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

template <class Self>
void report(Self* self, const metrics_actor& metrics, const train_snapshot& snap, const std::string& path,
            double seconds) {
  if (!metrics) return;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto gauge = [&](const char* name, double v) {
    self->send(metrics, gauge_atom_v, std::string(name), std::string(), v);
  };
  gauge("longwave_checkpoint_write_seconds", seconds);
  gauge("longwave_checkpoint_bytes", ec ? 0.0 : static_cast<double>(bytes));
  gauge("longwave_checkpoint_last_success_timestamp_seconds", now);
  self->send(metrics, count_atom_v, std::string("longwave_checkpoints_total"), std::string(), 1.0);
  self->send(metrics, record_atom_v,
             json_line("checkpoint")
                 .add("round", snap.round)
                 .add("step", snap.step)
                 .add("seconds", seconds)
                 .add("bytes", ec ? uint64_t{0} : static_cast<uint64_t>(bytes))
                 .str());
}

checkpointer_actor::behavior_type checkpointer_fun(
    checkpointer_actor::stateful_pointer<checkpointer_state> self, std::string dir, int64_t keep,
    snapshot_shape shape, metrics_actor metrics, std::function<std::string()> lock_lost,
    std::string resumed_from) {
  self->state.store = std::make_unique<checkpoint_store>(std::move(dir), keep);
  self->state.store->stand_on(std::move(resumed_from));
  self->state.shape = std::move(shape);
  self->state.lock_lost = std::move(lock_lost);
  try {
    self->state.slow_first_write_s = fault_seconds("LONGWAVE_FAULT_SLOW_CHECKPOINT_S");
  } catch (const lw_error& e) {
    spdlog::error("checkpoint: {} (ignored)", e.what());
  }
  return {
      [=](save_atom, const train_snapshot& snap) -> caf::result<std::string> {
        auto t0 = std::chrono::steady_clock::now();
        if (const auto what = first_non_finite(snap); !what.empty()) {
          if (metrics)
            self->send(metrics, count_atom_v, std::string("longwave_errors_total"),
                       std::string("reason=checkpoint_write"), 1.0);
          return make_error(
              errc::diverged,
              fmt::format("the state after round {} (inner step {}) has NaN or infinite values in "
                          "'{}': training diverged; not written, the checkpoints of earlier "
                          "rounds are kept",
                          snap.round, snap.step, what));
        }
        if (const auto why = self->state.lock_lost ? self->state.lock_lost() : std::string(); !why.empty())
          return make_error(errc::dir_lost,
                            fmt::format("checkpoint of round {} not written: {}", snap.round, why));
        try {
          const slow_write_watch watch(snap.round, self->state.store->dir());
          if (const double s = std::exchange(self->state.slow_first_write_s, 0.0); s > 0) {
            spdlog::warn("checkpoint: LONGWAVE_FAULT_SLOW_CHECKPOINT_S: round {}'s write takes {} s more",
                         snap.round, s);
            std::this_thread::sleep_for(std::chrono::duration<double>(s));
          }
          auto path = self->state.store->write(to_checkpoint(snap, self->state.shape));
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          spdlog::debug("checkpoint: wrote {} (round {}, step {}, {:.0f} ms)", path, snap.round, snap.step,
                        ms);
          report(self, metrics, snap, path, ms / 1000.0);
          trim_if_grown(self->state);
          return path;
        } catch (const std::exception& e) {
          spdlog::debug("checkpoint: write failed: {}", e.what());  // the coordinator says it, counted
          if (metrics)
            self->send(metrics, count_atom_v, std::string("longwave_errors_total"),
                       std::string("reason=checkpoint_write"), 1.0);
          return make_error(errc::io_error, e.what());
        }
      },
      [=](flush_atom) -> caf::result<bool> { return true; },
  };
}

}  // namespace

checkpointer_actor spawn_checkpointer(caf::actor_system& sys, std::string dir, int64_t keep,
                                      snapshot_shape shape, metrics_actor metrics,
                                      std::function<std::string()> lock_lost, std::string resumed_from) {
  return sys.spawn<caf::detached>(checkpointer_fun, std::move(dir), keep, std::move(shape),
                                  std::move(metrics), std::move(lock_lost), std::move(resumed_from));
}

}  // namespace longwave::actors
