// In-process communicator: mean of the local workers' tensors.
#include "actors/communicator.hpp"

#include <ATen/ATen.h>

#include "runtime/caf_errors.hpp"
#include "runtime/type_ids.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

caf::behavior communicator_fun(caf::event_based_actor* self) {
  return {
      [=](reduce_atom, uint64_t round, std::vector<at::Tensor> parts) -> caf::result<at::Tensor> {
        if (parts.empty()) return make_error(errc::peer_lost, "reduce with no contributions");
        const auto n = parts[0].numel();
        for (const auto& p : parts)
          if (!p.defined() || p.numel() != n)
            return make_error(errc::malformed_frame,
                              "contributions of round " + std::to_string(round) + " differ in size");
        at::NoGradGuard no_grad;
        auto sum = parts[0].to(at::kFloat).clone();
        for (size_t i = 1; i < parts.size(); ++i) sum.add_(parts[i]);
        sum.div_(static_cast<double>(parts.size()));
        return sum;
      },
  };
}

}  // namespace

caf::actor spawn_communicator(caf::actor_system& sys) {
  return sys.spawn<caf::detached>(communicator_fun);
}

}  // namespace longwave::actors
