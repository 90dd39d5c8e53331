// Communicator: local mean of the workers' tensors, then (in a cluster) the collective across nodes.
#include "actors/communicator.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <vector>

#include "comm/collective.hpp"
#include "comm/error_feedback.hpp"
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
  // Error-feedback residuals, one per ring label part (streaming syncs fragments of different sizes);
  // created on first use.
  std::map<uint32_t, std::unique_ptr<comm::error_feedback>> residuals;
  uint64_t sent = 0, received = 0;    // collective counters already reported
  double encode_s = 0, decode_s = 0;  // collective codec times already reported
};

/// Quantizes x in place chunk by chunk, as the collective will, carrying what is lost into the next round.
void apply_error_feedback(comm_state& s, uint32_t part, float* x, size_t n) {
  auto& residual = s.residuals[part];
  if (!residual || residual->size() != n) residual = std::make_unique<comm::error_feedback>(n);
  const size_t chunk = std::max<size_t>(1, s.opts.collective->chunk_elements());
  std::vector<std::byte> wire;
  std::vector<float> back;
  for (size_t off = 0, m = 0; off < n; off += m) {  // chunk may be SIZE_MAX: one piece
    m = std::min(chunk, n - off);
    residual->add_residual(x + off, m, off);
    wire.resize(comm::encoded_size(s.opts.dtype, m, s.opts.codec));
    comm::encode(s.opts.dtype, x + off, m, wire.data(), s.opts.codec);
    back.resize(m);
    LW_ASSERT(comm::decode(s.opts.dtype, wire.data(), wire.size(), m, back.data(), s.opts.codec),
              "own encoding did not decode");
    residual->update(x + off, back.data(), m, off);
    std::copy(back.begin(), back.end(), x + off);
  }
}

/// dtype: what this reduce used on the wire (comm.dtype, or fp32 for an exact one).
template <class Self>
void report(Self* self, comm_state& s, const ring_label& label, size_t n, double seconds,
            comm::wire_dtype dtype) {
  if (!s.opts.metrics) return;
  auto& m = s.opts.metrics;
  self->send(m, observe_atom_v, std::string("longwave_allreduce_seconds"), std::string(), seconds);
  uint64_t sent = 0, received = 0;
  double ratio = 1.0;
  if (s.opts.collective) {
    sent = s.opts.collective->bytes_sent() - s.sent;
    received = s.opts.collective->bytes_received() - s.received;
    s.sent += sent;
    s.received += received;
    self->send(m, count_atom_v, std::string("longwave_comm_bytes_sent_total"), "peer=" + s.opts.next_peer,
               static_cast<double>(sent));
    self->send(m, count_atom_v, std::string("longwave_comm_bytes_received_total"), "peer=" + s.opts.prev_peer,
               static_cast<double>(received));
    const auto wire = comm::encoded_size(dtype, n, s.opts.codec);
    if (wire > 0) ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(wire);
    const double enc = s.opts.collective->encode_seconds(), dec = s.opts.collective->decode_seconds();
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
  if (!s.opts.log_events) return;
  self->send(m, record_atom_v,
             json_line("allreduce")
                 .add("round", label.first)
                 .add("label", label.second)
                 .add("seconds", seconds)
                 .add("bytes_sent", sent)
                 .add("bytes_received", received)
                 .add("dtype", config::to_string(dtype))
                 .str());
}

using self_ptr = communicator_actor::stateful_pointer<comm_state>;

/// exact: fp32 on the wire whatever comm.dtype is, and no error feedback (parameters, not pseudo-gradients).
caf::result<at::Tensor> reduce(self_ptr self, const ring_label& label, std::vector<at::Tensor> parts,
                               bool exact) {
  auto& s = self->state;
  const uint64_t round = label.first;
  const auto t0 = std::chrono::steady_clock::now();
  const comm::wire_dtype dtype = exact ? comm::wire_dtype::fp32 : s.opts.dtype;
  if (parts.empty()) return make_error(errc::peer_lost, "reduce with no contributions");
  const auto n = parts[0].numel();
  for (const auto& p : parts)
    if (!p.defined() || p.numel() != n)
      return make_error(errc::malformed_frame,
                        "contributions of round " + std::to_string(round) + " differ in size");
  at::NoGradGuard no_grad;
  // A contribution that nobody else holds (a worker's fresh pseudo-gradient) is summed into in place; one
  // still held elsewhere (ddp's gradient buffer, eager's outer parameters) is copied first.
  auto& first = parts[0];
  const bool owned = first.use_count() == 1 && first.storage().use_count() == 1 &&
                     first.scalar_type() == at::kFloat && first.is_contiguous();
  auto sum = owned ? std::move(first) : first.to(at::kFloat).clone().contiguous();
  for (size_t i = 1; i < parts.size(); ++i) sum.add_(parts[i]);
  sum.div_(static_cast<double>(parts.size()));
  // A diverged round fails here, naming the round, in every mode: a non-finite average would otherwise be
  // applied, checkpointed over the good states, and (in a cluster) poison every node (int8 cannot encode
  // it). Parameters (exact) pass unchecked: the checkpointer refuses non-finite state anyway.
  if (!exact && !all_finite(sum))
    return make_error(errc::diverged,
                      fmt::format("the averaged update of round {} has NaN or infinite values: training "
                                  "diverged (lower train.lr, outer.lr or train.weight_decay); the "
                                  "checkpoints of earlier rounds are kept",
                                  round));
  if (s.opts.collective) {
    float* data = sum.data_ptr<float>();
    const bool observe = round == s.opts.observe_round;
    if (s.opts.error_feedback && dtype != comm::wire_dtype::fp32 && !observe)
      apply_error_feedback(s, label.second, data, static_cast<size_t>(n));
    try {
      s.opts.collective->allreduce(round, data, static_cast<size_t>(n),
                                   observe ? 0.0 : static_cast<double>(parts.size()), label.second, dtype);
    } catch (const lw_error& e) {
      if (s.opts.metrics)
        self->send(s.opts.metrics, count_atom_v, std::string("longwave_errors_total"),
                   std::string("reason=allreduce"), 1.0);
      return make_error(e.code(), "all-reduce of round " + std::to_string(round) + ": " + e.what());
    }
  }
  const double secs = seconds_since(t0);
  if (s.opts.collective)
    spdlog::debug("all-reduce of round {}: {:.3f} s, {} bytes sent", round, secs,
                  s.opts.collective->bytes_sent() - s.sent);
  report(self, s, label, static_cast<size_t>(n), secs, dtype);
  return sum;
}

/// Copies of the error-feedback residuals, for a snapshot. A request queued behind a running all-reduce is
/// answered after it, so the copy holds that all-reduce's residual.
residual_map residuals_of(const comm_state& s) {
  residual_map out;
  for (const auto& [label, ef] : s.residuals) {
    if (!ef) continue;
    const auto& r = ef->residual();
    auto t = at::empty({static_cast<int64_t>(r.size())}, at::kFloat);
    std::copy(r.begin(), r.end(), t.data_ptr<float>());
    out.emplace(label, std::move(t));
  }
  return out;
}

communicator_actor::behavior_type communicator_fun(self_ptr self, communicator_options opts) {
  self->state.opts = std::move(opts);
  return {
      [=](state_atom) -> caf::result<residual_map> { return residuals_of(self->state); },
      [=](load_atom, const residual_map& residuals) -> caf::result<bool> {
        auto& s = self->state;
        s.residuals.clear();
        for (const auto& [label, t] : residuals) {
          const auto c = t.to(at::kFloat).contiguous();
          const float* p = c.data_ptr<float>();
          s.residuals[label] = std::make_unique<comm::error_feedback>(std::vector<float>(p, p + c.numel()));
        }
        return true;
      },
      // By reference into the message, so that the tensors are moved out of it (see reduce).
      [=](reduce_atom, reduce_request& req) {
        return reduce(self, req.label, std::move(req.parts), req.exact);
      },
  };
}

}  // namespace

communicator_actor spawn_communicator(caf::actor_system& sys, communicator_options opts) {
  return sys.spawn<caf::detached>(communicator_fun, std::move(opts));
}

}  // namespace longwave::actors
