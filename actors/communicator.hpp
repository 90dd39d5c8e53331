#pragma once
// The communicator actor: averages pseudo-gradients (or, in ddp mode, gradients). In this process it
// averages the local workers' tensors; the cross-node ring all-reduce implements the same message.
#include <caf/fwd.hpp>

namespace longwave::actors {

/// Message: (reduce, round, std::vector<at::Tensor> parts) -> at::Tensor mean, summed in rank order in fp32
/// (deterministic, independent of arrival order).
caf::actor spawn_communicator(caf::actor_system& sys);

}  // namespace longwave::actors
