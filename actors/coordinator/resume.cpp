// Installs a resume snapshot before the first round: the policy takes its part, then the outer optimizer
// (with eager's per-replica state), the communicator's residuals and every replica are loaded, in that
// order.
#include <ATen/ATen.h>

#include <algorithm>

#include "actors/coordinator/state.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors::coordinator_parts {

using namespace longwave::runtime;

namespace {

/// Requests `msg` from `to`; k runs on success, an error fails the run.
template <class Handle, class... Ts>
void then_do(self_ptr self, const Handle& to, std::function<void()> k, Ts... msg) {
  self->request(to, self->state.request_timeout, std::move(msg)...)
      .then([k](bool) { k(); }, [self](caf::error& e) { fail(self, e); });
}

/// boundary: the snapshot is of a round's end, which a cluster node serves to joiners at once (as it serves
/// each boundary it reaches), not only from its first boundary after the resume.
void load_workers(self_ptr self, std::shared_ptr<const train_snapshot> snap, bool boundary) {
  auto left = std::make_shared<size_t>(snap->replicas.size());
  for (size_t i = 0; i < snap->replicas.size(); ++i)
    then_do(
        self, self->state.workers[i],
        [self, left, boundary] {
          if (--*left != 0 || self->state.ph != phase::resuming) return;
          if (!boundary) return begin_round(self);
          publish_boundary(self, [self] {
            if (self->state.ph == phase::resuming) begin_round(self);
          });
        },
        load_atom_v, snap->replicas[i]);
}

void load_residuals(self_ptr self, std::shared_ptr<const train_snapshot> snap, std::function<void()> k) {
  if (!self->state.has_residuals) return k();
  if (snap->residuals.empty() && snap->round > 0 && self->state.ctx->observe_round == 0)
    spdlog::warn(
        "the checkpoint holds no error-feedback residuals (written without error feedback or by an older "
        "version); they start from zero, so this resume is not exact");
  then_do(self, self->state.peers.communicator, std::move(k), load_atom_v, snap->residuals);
}

}  // namespace

void install_resume(self_ptr self) {
  auto& s = self->state;
  if (!set_phase(self, phase::resuming)) return;
  auto snap = std::move(*s.resume);
  s.resume.reset();
  s.round = snap.round;
  s.resumed_version = snap.version;
  s.first_step = s.last_step = static_cast<int64_t>(snap.step);
  // async: a checkpoint's step is the node's own; its replicas' Adam count may be a donor's (joined_start).
  const bool versions = s.ctx->cfg.diloco.outer == config::outer_policy_kind::async;
  s.step_offset = versions && !snap.replicas.empty() ? snap.replicas[0].adam_steps - s.first_step : 0;
  if (s.step_offset != 0)
    spdlog::info(
        "async: this node counts its own inner steps on from {}; its workers' AdamW step count (a donor's "
        "since a rejoin) goes on from {}",
        snap.step, snap.replicas[0].adam_steps);
  // Every inner step drew one batch, so a replica's sampler position counts the tokens it trained on (not
  // for a joiner of a round barrier: its position is the cluster's; an async joiner's is its own).
  const int64_t batch_tokens = s.ctx->inner.batch_size * s.ctx->spec.seq_len;
  const bool own_positions = !s.ctx->recovery || versions;
  for (size_t i = 0; i < snap.replicas.size() && i < s.tokens_before.size() && own_positions; ++i)
    s.tokens_before[i] = static_cast<int64_t>(snap.replicas[i].sampler_position) * batch_tokens;
  spdlog::info("resuming from round {}, inner step {}", snap.round, snap.step);
  s.newest_on_disk =
      fmt::format("round {}, inner step {} (the checkpoint this run resumed from)", snap.round, snap.step);
  const bool boundary = snap.round > 0 && std::all_of(snap.replicas.begin(), snap.replicas.end(),
                                                      [](const auto& r) { return r.steps_in_round == 0; });
  if (auto e = s.policy->resume_from(snap)) return fail(self, e);
  outer_snapshot outer{snap.theta,   snap.momentum,  s.policy->replica_outer_state(snap),
                       snap.version, snap.dn_buffer, snap.dn_arrivals};
  const auto shared = std::make_shared<const train_snapshot>(std::move(snap));
  then_do(
      self, s.peers.outer,
      [self, shared, boundary] {
        load_residuals(self, shared, [=] { load_workers(self, shared, boundary); });
      },
      load_atom_v, std::move(outer));
}

}  // namespace longwave::actors::coordinator_parts
