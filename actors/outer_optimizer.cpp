// Outer optimizer actor: theta <- theta - lr * (delta + mu * b), b <- mu * b + delta, on the whole of theta,
// on one fragment of it (streaming), or per replica on an eager proxy pseudo-gradient.
#include "actors/outer_optimizer.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>
#include <utility>

#include "models/outer_sgd.hpp"
#include "models/torch_compat.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

/// eager: one replica's outer state.
struct replica_outer {
  at::Tensor theta, prev_delta;  // prev_delta undefined before its first round
  std::unique_ptr<models::outer_sgd> opt;
};

struct outer_state {
  at::Tensor theta;
  std::unique_ptr<models::outer_sgd> opt;
  std::unique_ptr<models::delayed_nesterov> dn;  // diloco.outer = "async"
  ring_label last{0, 0};                         // the label of the last step
  bool stepped = false;
  std::vector<replica_outer> replicas;
  // eager: theta-sized buffers reused by every step. A fresh model-sized tensor faults in every page again
  // (about 1,800 faults for the tiny model), which cost 100-500 ms per round on a busy machine.
  at::Tensor proxy, mean_proxy, mean_theta;
  bool pinned = false;  // outer_policy::pinned_theta
  // delayed: the next whole-theta step, computed while the inner steps run (prepare_atom); its own step
  // then swaps it in. spare_*: the buffers the next one is written into, reused once nobody holds them.
  struct prepared_step {
    ring_label label;
    at::Tensor avg, theta, momentum;
    double delta_norm = 0, update_norm = 0;
  };
  std::optional<prepared_step> prepared;
  at::Tensor spare_theta, spare_momentum;
};

/// A copy of a theta for the state to own: in pinned host memory on a GPU node (outer_policy::pinned_theta).
at::Tensor own_theta(const outer_state& s, const at::Tensor& t) {
  if (!s.pinned) return t.clone();
  return at::empty(t.sizes(), t.options().pinned_memory(true)).copy_(t);
}

/// A copy of src in `spare` when nobody else holds it (no page faults, no pinned allocation), else in a new
/// tensor (pinned: as own_theta); spare is left empty.
at::Tensor copy_to_spare(const outer_state& s, at::Tensor& spare, const at::Tensor& src, bool pinned) {
  at::Tensor t = std::move(spare);
  if (t.defined() && t.use_count() == 1 && t.storage().use_count() == 1 && t.sizes() == src.sizes())
    return t.copy_(src);
  return pinned ? own_theta(s, src) : src.clone();
}

using outer_self = outer_actor::stateful_pointer<outer_state>;

void report(outer_self self, const metrics_actor& metrics, uint64_t round, double lr, double delta_norm,
            double update_norm) {
  if (!metrics) return;
  auto gauge = [&](const char* name, double v) {
    self->send(metrics, gauge_atom_v, std::string(name), std::string(), v);
  };
  gauge("longwave_outer_learning_rate", lr);
  gauge("longwave_outer_pseudo_gradient_norm", delta_norm);
  gauge("longwave_outer_update_norm", update_norm);
  self->send(metrics, record_atom_v,
             json_line("outer")
                 .add("round", round)
                 .add("pseudo_gradient_norm", delta_norm)
                 .add("update_norm", update_norm)
                 .add("outer_lr", lr)
                 .str());
}

/// Rejects a step that does not follow the last one.
caf::error check_order(outer_state& s, const ring_label& label) {
  if (s.stepped && label <= s.last)
    return make_error(errc::stale_round, "outer step for round " + std::to_string(label.first) + " (" +
                                             std::to_string(label.second) + ") after round " +
                                             std::to_string(s.last.first) + " (" +
                                             std::to_string(s.last.second) + ")");
  return {};
}

caf::error check_size(const at::Tensor& t, int64_t n, const char* what) {
  if (t.defined() && t.numel() == n) return {};
  return make_error(errc::malformed_frame, std::string(what) + " has " +
                                               std::to_string(t.defined() ? t.numel() : 0) +
                                               " values, expected " + std::to_string(n));
}

/// Runs f, turning a torch exception (or another, such as bad_alloc) into an error.
template <class F>
caf::error torch_guarded(const char* what, F&& f) {
  try {
    f();
    return {};
  } catch (const c10::Error& e) {
    return make_error(errc::torch_error, std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return make_error(errc::torch_error, std::string(what) + ": " + describe(e));
  }
}

/// theta, b and (eager) each replica's theta_m, b_m, prev_delta: clones, or the live tensors if lend.
outer_snapshot state_of(outer_state& s, bool lend) {
  auto copy = [lend](const at::Tensor& t) { return t.defined() && !lend ? t.clone() : t; };
  outer_snapshot out{copy(s.theta), copy(s.opt->momentum_buffer()), {}, 0, {}, 0};
  if (s.dn) {
    out.momentum = copy(s.dn->momentum_buffer());
    out.dn_buffer = copy(s.dn->period_buffer());
    out.version = static_cast<uint64_t>(s.dn->merges());
    out.dn_arrivals = s.dn->arrivals();
  }
  for (auto& r : s.replicas)
    out.replicas.push_back({copy(r.theta), copy(r.opt->momentum_buffer()), copy(r.prev_delta)});
  return out;
}

/// Records a step as the last one (check_order compares the next with it).
void finish_step(outer_state& s, const ring_label& label) {
  s.last = label;
  s.stepped = true;
}

/// The outer step of a ring label's average: part 0 on the whole of theta, part j on streaming fragment
/// j % P.
caf::result<at::Tensor> outer_step(outer_self self, const metrics_actor& metrics, const outer_policy& policy,
                                   const ring_label& label, const at::Tensor& delta, int64_t arrivals = 1) {
  auto& s = self->state;
  const bool whole = label.second == 0;
  if (!whole && policy.fragments.empty())
    return make_error(errc::invalid_config, "fragment outer step without streaming fragments");
  if (auto e = check_order(s, label)) return e;
  const auto* ranges = whole ? nullptr : &policy.fragments[label.second % policy.fragments.size()];
  const int64_t n = whole ? s.theta.numel() : models::range_size(*ranges);
  if (auto e = check_size(delta, n, whole ? "pseudo-gradient" : "fragment pseudo-gradient")) return e;
  if (auto p = std::exchange(s.prepared, std::nullopt);
      p && whole && p->label == label && p->avg.is_same(delta)) {  // computed already: swapped in
    s.spare_theta = std::exchange(s.theta, p->theta);
    s.spare_momentum = s.opt->momentum_buffer();
    s.opt->set_momentum_buffer(p->momentum);
    report(self, metrics, label.first, s.opt->lr(), p->delta_norm, p->update_norm);
    finish_step(s, label);
    return s.theta;
  }
  auto e = torch_guarded("outer step", [&] {
    const double delta_norm = delta.norm().item<double>();
    double update_norm = 0;
    if (s.dn) {
      // Merges apply while workers load theta and snapshots clone it: a theta someone still holds is left
      // as it is (that version stays whole for them), and the step writes a copy.
      if (s.theta.use_count() > 1 || s.theta.storage().use_count() > 1) s.theta = own_theta(s, s.theta);
      at::Tensor g = delta.is_contiguous() ? delta : delta.contiguous();
      update_norm = s.dn->step(s.theta, g, arrivals);
    } else {
      update_norm = whole ? s.opt->step(s.theta, delta) : s.opt->step(s.theta, delta, *ranges);
    }
    report(self, metrics, label.first, s.opt->lr(), delta_norm, update_norm);
  });
  if (e) return e;
  finish_step(s, label);
  return s.theta;
}

/// delayed: label's step computed now into spare buffers, while the inner steps run, the state untouched
/// (a snapshot meanwhile holds theta and the momentum before it). Bit for bit the step itself; whatever
/// does not fit (an out-of-order label, a wrong size, a torch error) is left to the step to report.
void prepare(outer_state& s, const ring_label& label, const at::Tensor& avg) {
  s.prepared.reset();
  if (s.dn || label.second != 0 || !s.replicas.empty() || check_order(s, label) ||
      check_size(avg, s.theta.numel(), "average"))
    return;
  (void)torch_guarded("outer step", [&] {
    outer_state::prepared_step p{label, avg, copy_to_spare(s, s.spare_theta, s.theta, s.pinned), {}};
    const at::Tensor live = s.opt->momentum_buffer();
    if (live.defined()) p.momentum = copy_to_spare(s, s.spare_momentum, live, false);
    s.opt->set_momentum_buffer(p.momentum);  // the step below writes this copy (or makes the first)
    try {
      p.delta_norm = avg.norm().item<double>();
      p.update_norm = s.opt->step(p.theta, avg);
    } catch (...) {
      s.opt->set_momentum_buffer(live);
      throw;
    }
    p.momentum = std::exchange(s.opt->momentum_buffer(), live);
    s.prepared = std::move(p);
  });
}

/// eager: each replica's outer step on its proxy pseudo-gradient avg_prev + (delta_m - prev_delta_m) / M,
/// then theta = the replicas' mean.
caf::result<eager_thetas> eager_step(outer_self self, const metrics_actor& metrics, double global_workers,
                                     uint64_t round, const at::Tensor& avg_prev,
                                     const std::vector<at::Tensor>& deltas) {
  auto& s = self->state;
  const int64_t n = s.theta.numel();
  if (deltas.size() != s.replicas.size())
    return make_error(errc::malformed_frame, "eager step with " + std::to_string(deltas.size()) +
                                                 " pseudo-gradients for " +
                                                 std::to_string(s.replicas.size()) + " replicas");
  if (auto e = check_order(s, {round, 0})) return e;
  if (avg_prev.defined())
    if (auto e = check_size(avg_prev, n, "average")) return e;
  for (const auto& d : deltas)
    if (auto e = check_size(d, n, "pseudo-gradient")) return e;
  eager_thetas out;
  auto e = torch_guarded("eager outer step", [&] {
    models::no_grad_guard no_grad;
    const double inv_m = 1.0 / global_workers;
    for (auto* t : {&s.proxy, &s.mean_proxy, &s.mean_theta})
      if (!t->defined() || t->numel() != n) *t = at::empty_like(s.theta);
    auto& proxy = s.proxy;
    auto& mean_proxy = s.mean_proxy.zero_();
    auto& mean_theta = s.mean_theta.zero_();
    for (size_t m = 0; m < deltas.size(); ++m) {
      auto& r = s.replicas[m];
      // proxy = avg_prev + (delta_m - prev_delta_m) / M, with absent terms as 0.
      at::mul_out(proxy, deltas[m], inv_m);
      if (r.prev_delta.defined()) proxy.sub_(r.prev_delta, inv_m);
      if (avg_prev.defined()) proxy.add_(avg_prev);
      r.opt->step(r.theta, proxy);
      r.prev_delta = deltas[m];
      mean_proxy.add_(proxy);
      mean_theta.add_(r.theta);
      out.replicas.push_back(r.theta);
    }
    const double k = static_cast<double>(deltas.size());
    mean_proxy.div_(k);
    mean_theta.div_(k);
    const double update_norm = at::sub_out(proxy, mean_theta, s.theta).norm().item<double>();
    // In place, as the other outer steps update theta: whoever must keep a theta clones it.
    s.theta.copy_(mean_theta);
    out.theta = s.theta;
    report(self, metrics, round, s.opt->lr(), mean_proxy.norm().item<double>(), update_norm);
  });
  if (e) return e;
  finish_step(s, {round, 0});
  return out;
}

/// Installs theta, b and (if given) eager's per-replica state, cloned.
caf::result<bool> load(outer_state& s, const outer_snapshot& snap) {
  if (!snap.replicas.empty() && snap.replicas.size() != s.replicas.size())
    return make_error(errc::corrupt_checkpoint, "eager outer state for " +
                                                    std::to_string(snap.replicas.size()) + " replicas, " +
                                                    std::to_string(s.replicas.size()) + " expected");
  auto clone = [](const at::Tensor& t) { return t.defined() ? t.clone() : at::Tensor(); };
  s.prepared.reset();
  // async: a theta another actor may hold is not written (as in its steps).
  if (s.dn)
    s.theta = own_theta(s, snap.theta);
  else
    s.theta.copy_(snap.theta);
  s.opt->set_momentum_buffer(clone(snap.momentum));
  if (s.dn) {
    s.dn->momentum_buffer() = clone(snap.momentum);
    s.dn->period_buffer() = clone(snap.dn_buffer);
    s.dn->set_merges(static_cast<int64_t>(snap.version));
    s.dn->set_arrivals(snap.dn_arrivals);
  }
  for (size_t m = 0; m < snap.replicas.size(); ++m) {
    auto& r = s.replicas[m];
    r.theta = own_theta(s, snap.replicas[m].theta);
    r.opt->set_momentum_buffer(clone(snap.replicas[m].momentum));
    r.prev_delta = clone(snap.replicas[m].prev_delta);
  }
  s.stepped = false;
  return true;
}

outer_actor::behavior_type outer_fun(outer_self self, config::outer_section cfg, at::Tensor theta0,
                                     metrics_actor metrics, outer_policy policy) {
  auto& st = self->state;
  st.pinned = policy.pinned_theta;
  st.theta = st.pinned ? own_theta(st, theta0) : std::move(theta0);
  st.opt = std::make_unique<models::outer_sgd>(cfg.lr, cfg.momentum, cfg.nesterov);
  if (policy.dn_period > 0)
    st.dn = std::make_unique<models::delayed_nesterov>(cfg.lr, cfg.momentum, policy.dn_period);
  for (int64_t m = 0; m < policy.eager_replicas; ++m)
    st.replicas.push_back({own_theta(st, st.theta), at::Tensor(),
                           std::make_unique<models::outer_sgd>(cfg.lr, cfg.momentum, cfg.nesterov)});
  return {
      [=](theta_atom) -> caf::result<at::Tensor> { return self->state.theta; },
      [=](theta_atom, bool copy) -> caf::result<at::Tensor> {
        return copy ? self->state.theta.clone() : self->state.theta;
      },
      [=](replicas_atom, int64_t n) -> caf::result<std::vector<at::Tensor>> {
        auto& s = self->state;
        std::vector<at::Tensor> out;
        for (int64_t m = 0; m < n; ++m)
          out.push_back(static_cast<size_t>(m) < s.replicas.size() ? s.replicas[static_cast<size_t>(m)].theta
                                                                   : s.theta);
        return out;
      },
      [=](set_atom, at::Tensor theta) -> caf::result<bool> {
        if (auto e = check_size(theta, self->state.theta.numel(), "theta")) return e;
        self->state.prepared.reset();
        self->state.theta = own_theta(self->state, theta);
        return true;
      },
      [=](outer_atom, ring_label label, at::Tensor delta) {
        return outer_step(self, metrics, policy, label, delta);
      },
      [=](prepare_atom, ring_label label, at::Tensor avg) { prepare(self->state, label, avg); },
      [=](merge_atom, uint64_t version, at::Tensor delta, int64_t arrivals) -> caf::result<at::Tensor> {
        if (!self->state.dn)
          return make_error(errc::invalid_config, "an async merge without diloco.outer = async");
        // 0: every contribution was lost before the all-reduce; the version still comes, moving nothing.
        if (arrivals < 0) return make_error(errc::invalid_config, "an async merge of a negative count");
        return outer_step(self, metrics, policy, ring_label{version, 0}, delta, arrivals);
      },
      [=](eager_atom, uint64_t round, at::Tensor avg_prev, std::vector<at::Tensor> deltas) {
        const double live = policy.live_workers ? policy.live_workers() : 0.0;
        return eager_step(self, metrics, live > 0 ? live : static_cast<double>(policy.global_workers), round,
                          avg_prev, deltas);
      },
      // lend: theta and b themselves; the caller steps nothing until the snapshot is written.
      [=](state_atom, bool lend) -> caf::result<outer_snapshot> { return state_of(self->state, lend); },
      [=](load_atom, const outer_snapshot& snap) { return load(self->state, snap); },
  };
}

}  // namespace

outer_actor spawn_outer_optimizer(caf::actor_system& sys, const config::outer_section& cfg, at::Tensor theta0,
                                  metrics_actor metrics, outer_policy policy) {
  // Its own thread: a model-sized step (a prepared one mid-round, an async merge) would otherwise hold the
  // scheduler thread the coordinator shares.
  return sys.spawn<caf::detached>(outer_fun, cfg, std::move(theta0), std::move(metrics), std::move(policy));
}

}  // namespace longwave::actors
