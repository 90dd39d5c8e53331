// Checkpointer actor: one detached thread owning the checkpoint_store; saves are processed in order.
#include "actors/checkpointer.hpp"

#include <chrono>

#include "runtime/caf_errors.hpp"
#include "runtime/log.hpp"
#include "runtime/type_ids.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct checkpointer_state {
  std::unique_ptr<checkpoint_store> store;
  snapshot_shape shape;
};

caf::behavior checkpointer_fun(caf::stateful_actor<checkpointer_state>* self, std::string dir, int64_t keep,
                               snapshot_shape shape) {
  self->state.store = std::make_unique<checkpoint_store>(std::move(dir), keep);
  self->state.shape = std::move(shape);
  return {
      [=](save_atom, const train_snapshot& snap) -> caf::result<std::string> {
        auto t0 = std::chrono::steady_clock::now();
        try {
          auto path = self->state.store->write(to_checkpoint(snap, self->state.shape));
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          spdlog::debug("checkpoint: wrote {} (round {}, step {}, {:.0f} ms)", path, snap.round, snap.step,
                        ms);
          return path;
        } catch (const std::exception& e) {
          spdlog::error("checkpoint: write failed: {}", e.what());
          return make_error(errc::io_error, e.what());
        }
      },
      [=](flush_atom) { return true; },
  };
}

}  // namespace

caf::actor spawn_checkpointer(caf::actor_system& sys, std::string dir, int64_t keep, snapshot_shape shape) {
  return sys.spawn<caf::detached>(checkpointer_fun, std::move(dir), keep, std::move(shape));
}

}  // namespace longwave::actors
