// Communicator: local mean of the workers' tensors, then (in a cluster) the collective across nodes.
#include "actors/communicator.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "comm/collective.hpp"
#include "comm/reduction.hpp"
#include "comm/ring_allreduce.hpp"
#include "models/host_stage.hpp"
#include "models/torch_compat.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"
#include "runtime/tensor/tensor_checks.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct comm_state {
  communicator_options opts;
  bool cluster = false;                        // opts.collective was given: the reduce crosses nodes
  std::shared_ptr<comm::collective> net;       // that collective, or one process's ring of one rank
  std::unique_ptr<comm::reduction> chosen;     // comm.dtype's reduction, picked once
  std::unique_ptr<comm::reduction> exact;      // fp32, for parameters
  uint64_t sent = 0, received = 0;             // collective counters already reported
  uint64_t clipped_reported = 0;               // sparse contributions clipped to the median norm
  double encode_s = 0, decode_s = 0;           // codec times already reported
  double send_wait_s = 0, receive_wait_s = 0;  // collective wait times already reported
  std::unique_ptr<models::host_stage> stage;   // stage_mean: the mean's way off the parts' device
};

/// This reduce's waits (seconds held up by the next node, by the previous one) into the metrics, and a line
/// naming the next node when waiting to send to it took most of a long all-reduce: the link to it (or it) is
/// the ring's slowest, since on a ring only the rank before a slow link waits to send.
template <class Self>
std::pair<double, double> report_waits(Self* self, comm_state& s, const ring_label& label, double seconds) {
  const double send_total = s.opts.collective->send_wait_seconds();
  const double receive_total = s.opts.collective->receive_wait_seconds();
  const std::pair<double, double> waits{send_total - s.send_wait_s, receive_total - s.receive_wait_s};
  s.send_wait_s = send_total;
  s.receive_wait_s = receive_total;
  auto& m = s.opts.metrics;
  self->send(m, count_atom_v, std::string("longwave_comm_send_wait_seconds_total"),
             "peer=" + s.opts.next_peer, waits.first);
  self->send(m, count_atom_v, std::string("longwave_comm_receive_wait_seconds_total"),
             "peer=" + s.opts.prev_peer, waits.second);
  if (seconds >= 1.0 && waits.first > 0.5 * seconds)
    spdlog::warn(
        "all-reduce of round {}: {:.1f} of {:.1f} s waiting for {} to take this node's chunks: "
        "the link to it (or {} itself) is the ring's slowest",
        label.first, waits.first, seconds, s.opts.next_peer, s.opts.next_peer);
  return waits;
}

/// r: the reduction this reduce used (comm.dtype's, or the exact one).
template <class Self>
void report(Self* self, comm_state& s, const comm::reduction& r, const ring_label& label, size_t n,
            double seconds) {
  if (!s.opts.metrics) return;
  auto& m = s.opts.metrics;
  self->send(m, observe_atom_v, std::string("longwave_allreduce_seconds"), std::string(), seconds);
  uint64_t sent = 0, received = 0;
  std::pair<double, double> waits{0, 0};
  if (s.cluster) {
    waits = report_waits(self, s, label, seconds);
    sent = s.net->bytes_sent() - s.sent;
    received = s.net->bytes_received() - s.received;
    s.sent += sent;
    s.received += received;
    self->send(m, count_atom_v, std::string("longwave_comm_bytes_sent_total"), "peer=" + s.opts.next_peer,
               static_cast<double>(sent));
    self->send(m, count_atom_v, std::string("longwave_comm_bytes_received_total"), "peer=" + s.opts.prev_peer,
               static_cast<double>(received));
  }
  double ratio = 1.0;
  // fp32 codes nothing in one process.
  if (s.cluster || r.dtype() != comm::wire_dtype::fp32) {
    const auto wire = r.wire_bytes(n);
    if (wire > 0) ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(wire);
    const double enc = s.chosen->stats().encode_seconds + s.net->encode_seconds();
    const double dec = s.chosen->stats().decode_seconds + s.net->decode_seconds();
    self->send(m, count_atom_v, std::string("longwave_codec_encode_seconds_total"), std::string(),
               enc - s.encode_s);
    self->send(m, count_atom_v, std::string("longwave_codec_decode_seconds_total"), std::string(),
               dec - s.decode_s);
    s.encode_s = enc;
    s.decode_s = dec;
  }
  self->send(m, gauge_atom_v, std::string("longwave_allreduce_wire_bytes"), std::string(),
             static_cast<double>(sent));
  self->send(m, gauge_atom_v, std::string("longwave_comm_compression_ratio"), std::string(), ratio);
  self->send(m, gauge_atom_v, std::string("longwave_comm_density"), std::string(), r.density(n));
  if (const auto norm = s.chosen->residual_norm(label.second))
    self->send(m, gauge_atom_v, std::string("longwave_comm_residual_norm"), std::string(), *norm);
  const uint64_t clipped = s.chosen->stats().clipped;
  if (clipped > s.clipped_reported) {
    self->send(m, count_atom_v, std::string("longwave_comm_clipped_total"), std::string(),
               static_cast<double>(clipped - s.clipped_reported));
    s.clipped_reported = clipped;
  }
  if (!s.opts.log_events) return;
  self->send(m, record_atom_v,
             json_line("allreduce")
                 .add("round", label.first)
                 .add("label", label.second)
                 .add("seconds", seconds)
                 .add("bytes_sent", sent)
                 .add("bytes_received", received)
                 .add("send_wait_seconds", waits.first)
                 .add("receive_wait_seconds", waits.second)
                 .add("next", s.opts.next_peer)
                 .add("dtype", config::to_string(r.dtype()))
                 .str());
}

using comm_self = communicator_actor::stateful_pointer<comm_state>;

/// t itself when nobody else holds it (a worker's fresh pseudo-gradient) and it is contiguous fp32, else a
/// contiguous fp32 copy (ddp's gradient buffer, eager's outer parameters): a tensor the caller may write.
at::Tensor writable(at::Tensor t) {
  if (t.use_count() == 1 && t.storage().use_count() == 1 && t.scalar_type() == at::kFloat &&
      t.is_contiguous())
    return t;
  return t.to(at::kFloat).clone().contiguous();
}

/// The workers' mean in rank order (fp32, deterministic): `sum` holds the first part's values on entry.
void mean_in_rank_order(at::Tensor& sum, const std::vector<at::Tensor>& parts) {
  for (size_t i = 1; i < parts.size(); ++i) sum.add_(parts[i]);
  sum.div_(static_cast<double>(parts.size()));
}

}  // namespace

at::Tensor staged_mean(std::unique_ptr<models::host_stage>& stage, std::vector<at::Tensor> parts) {
  const auto device = parts[0].device();
  for (auto& p : parts)
    if (p.device() != device) p = p.to(device);
  auto mean = writable(parts[0]);  // a copy: the worker still owns the part's buffer
  mean_in_rank_order(mean, parts);
  if (!stage || stage->compute().device() != device) stage = std::make_unique<models::host_stage>(device);
  auto staged = stage->stage(mean);  // the stage keeps the mean alive until its copy is done
  mean = at::Tensor();
  staged.done->synchronize();  // the copy came after the mean's kernels: they have read the parts
  parts.clear();               // only now may a worker write its buffer again
  stage->release_sources();    // the mean's device buffer too, during the next inner steps
  return std::move(staged.host);
}

namespace {

/// exact: fp32 on the wire whatever comm.dtype is, and no error feedback (parameters, not pseudo-gradients).
/// node_weight: the node's weight (-1: one per part; 0: it only relays, as a joiner's observed round;
/// comm::rank0_weight: the epoch's rank 0 alone, for theta_0).
caf::result<reduced> reduce(comm_self self, const ring_label& label, std::vector<at::Tensor> parts,
                            bool exact, double node_weight, bool empty_ok) {
  auto& s = self->state;
  const uint64_t round = label.first;
  const auto t0 = std::chrono::steady_clock::now();
  if (parts.empty()) return make_error(errc::peer_lost, "reduce with no contributions");
  const auto n = parts[0].numel();
  for (const auto& p : parts)
    if (!p.defined() || p.numel() != n)
      return make_error(errc::malformed_frame,
                        "contributions of round " + std::to_string(round) + " differ in size");
  models::no_grad_guard no_grad;
  const auto n_parts = parts.size();
  at::Tensor sum;
  if (!parts[0].is_cpu() || (s.opts.stage_mean && !exact)) {  // parameters (exact) are host tensors
    sum = staged_mean(s.stage, std::move(parts));
  } else {  // in process: the workers' mean, into the first contribution when it is writable, else a copy
    sum = writable(std::move(parts[0]));
    mean_in_rank_order(sum, parts);
  }
  // A diverged round fails here, naming the round, in every mode: a non-finite average would otherwise be
  // applied, checkpointed over the good states, and (in a cluster) poison every node (int8 cannot encode
  // it). Parameters (exact) pass unchecked: the checkpointer refuses non-finite state anyway.
  if (!exact && !all_finite(sum))
    return make_error(errc::diverged,
                      fmt::format("the averaged update of round {} has NaN or infinite values: training "
                                  "diverged (lower train.lr, outer.lr or train.weight_decay); the "
                                  "checkpoints of earlier rounds are kept",
                                  round));
  // Across nodes: the node's reduction through the collective, with its weight (workers, or tokens).
  const bool observe = (s.opts.observe_round > 0 && round == s.opts.observe_round) || node_weight == 0;
  const double weight = observe                             ? 0.0
                        : node_weight == comm::rank0_weight ? node_weight
                        : node_weight > 0                   ? node_weight
                                                            : static_cast<double>(n_parts);
  auto& r = exact ? *s.exact : *s.chosen;
  try {
    r.apply(*s.net, round, label.second, sum.data_ptr<float>(), static_cast<size_t>(n), weight);
  } catch (const lw_error& e) {
    if (s.opts.metrics && s.cluster)
      self->send(s.opts.metrics, count_atom_v, std::string("longwave_errors_total"),
                 std::string("reason=allreduce"), 1.0);
    if (!s.cluster) return make_error(e.code(), "round " + std::to_string(round) + ": " + e.what());
    return make_error(e.code(), "all-reduce of round " + std::to_string(round) + ": " + e.what());
  }
  const double secs = seconds_since(t0);
  if (s.cluster)
    spdlog::debug("all-reduce of round {}: {:.3f} s, {} bytes sent", round, secs,
                  s.net->bytes_sent() - s.sent);
  report(self, s, r, label, static_cast<size_t>(n), secs);
  // Every node weighed 0 (this one did, and so the total): the zeros average nothing.
  const bool empty = s.cluster && weight == 0.0 && s.net->last_total_weight() == 0.0;
  if (empty && !empty_ok)
    return make_error(errc::invalid_config,
                      fmt::format("all-reduce of round {}: every node contributed weight 0, so there is "
                                  "nothing to average",
                                  round));
  return reduced{std::move(sum), s.cluster ? s.net->last_members() : std::vector<std::string>{}, empty};
}

/// Copies of the error-feedback residuals, for a snapshot. A request queued behind a running all-reduce is
/// answered after it, so the copy holds that all-reduce's residual.
residual_map residuals_of(const comm_state& s) {
  residual_map out;
  for (const auto& [label, r] : s.chosen->residuals()) {
    auto t = at::empty({static_cast<int64_t>(r.size())}, at::kFloat);
    std::copy(r.begin(), r.end(), t.data_ptr<float>());
    out.emplace(label, std::move(t));
  }
  return out;
}

/// Installs a checkpoint's residuals. One written by a single process before one process became one node
/// holds a residual per worker (keys above 16 bits): those are dropped, and error feedback starts afresh.
void load_residuals(comm_state& s, const residual_map& residuals) {
  comm::residual_vectors vectors;
  size_t dropped = 0;
  for (const auto& [label, t] : residuals) {
    if (label >= (1u << 16)) {
      ++dropped;
      continue;
    }
    const auto c = t.to(at::kFloat).contiguous();
    const float* p = c.data_ptr<float>();
    vectors.emplace(label, std::vector<float>(p, p + c.numel()));
  }
  if (dropped > 0)
    spdlog::warn(
        "the checkpoint holds {} per-worker error-feedback residuals of an older single-process run; one "
        "process now reduces as one node, so they are dropped and error feedback starts from zero",
        dropped);
  s.chosen->load(std::move(vectors));
}

communicator_actor::behavior_type communicator_fun(comm_self self, communicator_options opts) {
  auto& s = self->state;
  s.opts = std::move(opts);
  s.cluster = s.opts.collective != nullptr;
  s.net = s.opts.collective;
  if (!s.net) {
    auto local = s.opts.local;
    local.dtype = comm::dense_dtype(s.opts.reduction.dtype);
    local.codec = s.opts.reduction.codec;
    s.net = std::make_shared<comm::ring_allreduce>(0, std::vector<std::string>{"local"}, local);
  }
  s.chosen = comm::make_reduction(s.opts.reduction);
  s.exact = comm::exact_reduction();
  return {
      [=](state_atom) -> caf::result<residual_map> { return residuals_of(self->state); },
      [=](load_atom, const residual_map& residuals) -> caf::result<bool> {
        load_residuals(self->state, residuals);
        return true;
      },
      // By reference into the message, so that the tensors are moved out of it (see reduce).
      [=](reduce_atom, reduce_request& req) {
        return reduce(self, req.label, std::move(req.parts), req.exact, req.weight, req.empty_ok);
      },
  };
}

}  // namespace

communicator_actor spawn_communicator(caf::actor_system& sys, communicator_options opts) {
  return sys.spawn<caf::detached>(communicator_fun, std::move(opts));
}

}  // namespace longwave::actors
