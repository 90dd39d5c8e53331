// Picks the round policy of run.mode and diloco.outer. A new policy is one file that defines its maker, and
// here its declaration and its case.
#include "actors/round/round_policy.hpp"

namespace longwave::actors {

std::unique_ptr<round_policy> make_single_policy(round_engine& engine);
std::unique_ptr<round_policy> make_ddp_policy(round_engine& engine);
std::unique_ptr<round_policy> make_sync_policy(round_engine& engine);
std::unique_ptr<round_policy> make_one_late_policy(round_engine& engine, bool eager);
std::unique_ptr<round_policy> make_streaming_policy(round_engine& engine);
std::unique_ptr<round_policy> make_federated_policy(round_engine& engine);
std::unique_ptr<round_policy> make_async_policy(round_engine& engine);

std::unique_ptr<round_policy> make_round_policy(round_engine& engine, const run_context& ctx) {
  using config::outer_policy_kind;
  using config::run_mode;
  switch (ctx.cfg.run.mode) {
    case run_mode::single: return make_single_policy(engine);
    case run_mode::ddp: return make_ddp_policy(engine);
    case run_mode::diloco: break;
  }
  switch (ctx.cfg.diloco.outer) {
    case outer_policy_kind::sync:
      return ctx.cfg.federated.clients_per_round > 0 ? make_federated_policy(engine)
                                                     : make_sync_policy(engine);
    case outer_policy_kind::delayed: return make_one_late_policy(engine, /*eager=*/false);
    case outer_policy_kind::eager: return make_one_late_policy(engine, /*eager=*/true);
    case outer_policy_kind::streaming: return make_streaming_policy(engine);
    case outer_policy_kind::async: return make_async_policy(engine);
  }
  return make_sync_policy(engine);
}

}  // namespace longwave::actors
