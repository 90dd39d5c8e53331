// Checkpointer actor: one detached thread owning the checkpoint_store; saves are processed in order.
#include "actors/checkpointer.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <utility>

#include "runtime/json/json_line.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"
#include "runtime/tensor/tensor_checks.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct checkpointer_state {
  std::unique_ptr<checkpoint_store> store;
  snapshot_shape shape;
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

/// The name of the first tensor of the snapshot with NaN or infinite values ("" if none). A diverged state is
/// never written: it would rotate the good checkpoints out.
std::string first_non_finite(const train_snapshot& snap) {
  auto bad = [](const at::Tensor& t) { return !all_finite(t); };
  if (bad(snap.theta)) return "theta";
  if (bad(snap.momentum)) return "momentum";
  if (bad(snap.pending)) return "pending";
  for (const auto& r : snap.replicas) {
    const std::string p = "replica" + std::to_string(r.rank) + "/";
    for (auto [name, t] :
         {std::pair{"master", &r.master}, std::pair{"exp_avg", &r.exp_avg},
          std::pair{"exp_avg_sq", &r.exp_avg_sq}, std::pair{"outer_theta", &r.outer_theta},
          std::pair{"outer_momentum", &r.outer_momentum}, std::pair{"prev_delta", &r.prev_delta}})
      if (bad(*t)) return p + name;
  }
  for (const auto& [label, t] : snap.residuals)
    if (bad(t)) return "ef/" + std::to_string(label);
  return "";
}

checkpointer_actor::behavior_type checkpointer_fun(
    checkpointer_actor::stateful_pointer<checkpointer_state> self, std::string dir, int64_t keep,
    snapshot_shape shape, metrics_actor metrics) {
  self->state.store = std::make_unique<checkpoint_store>(std::move(dir), keep);
  self->state.shape = std::move(shape);
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
        try {
          auto path = self->state.store->write(to_checkpoint(snap, self->state.shape));
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          spdlog::debug("checkpoint: wrote {} (round {}, step {}, {:.0f} ms)", path, snap.round, snap.step,
                        ms);
          report(self, metrics, snap, path, ms / 1000.0);
          return path;
        } catch (const std::exception& e) {
          spdlog::error("checkpoint: write failed: {}", e.what());
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
                                      snapshot_shape shape, metrics_actor metrics) {
  return sys.spawn<caf::detached>(checkpointer_fun, std::move(dir), keep, std::move(shape),
                                  std::move(metrics));
}

}  // namespace longwave::actors
