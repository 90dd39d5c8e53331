#pragma once
// The worker actor: one model replica with its AdamW state and data stream. Detached (it runs LibTorch
// compute); each inner step is one message to self, so control messages interleave between steps.
#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>

#include "actors/run_context.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// Spawns worker `rank`. Step reports go to `coordinator` as (report_atom, step_report).
runtime::worker_actor spawn_worker(caf::actor_system& sys, std::shared_ptr<const run_context> ctx,
                                   int64_t rank, const runtime::coordinator_actor& coordinator);

}  // namespace longwave::actors
