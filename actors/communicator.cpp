// Communicator: local mean of the workers' tensors, then (in a cluster) the collective across nodes.
#include "actors/communicator.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "comm/collective.hpp"
#include "comm/error_feedback.hpp"
#include "comm/shared_mask.hpp"
#include "comm/sparse_error_feedback.hpp"
#include "comm/sparse_sum.hpp"
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
  // Error-feedback residuals, one per ring label part (streaming syncs fragments of different sizes);
  // created on first use.
  std::map<uint32_t, std::unique_ptr<comm::error_feedback>> residuals;
  // comm.dtype = "sparse": its residuals instead, by the same labels.
  std::map<uint32_t, std::unique_ptr<comm::sparse_error_feedback>> sparse_residuals;
  uint64_t sent = 0, received = 0;                  // collective counters already reported
  uint64_t clipped = 0, clipped_reported = 0;       // sparse contributions clipped to the median norm
  double sparse_encode_s = 0, sparse_decode_s = 0;  // the sparse codec's time (it runs here, not in the ring)
  double encode_s = 0, decode_s = 0;                // collective codec times already reported
  double send_wait_s = 0, receive_wait_s = 0;       // collective wait times already reported
};

/// back[0..m) = what every receiver decodes once x[0..m) went out as one chunk of dtype (x and back may be
/// the same). False if the codec refused the values (int8 of NaN or inf); back is then unchanged.
bool round_trip(const comm_state& s, comm::wire_dtype dtype, const float* x, size_t m, float* back,
                std::vector<std::byte>& wire) {
  wire.resize(comm::encoded_size(dtype, m, s.opts.codec));
  comm::encode(dtype, x, m, wire.data(), s.opts.codec);
  return comm::decode(dtype, wire.data(), wire.size(), m, back, s.opts.codec);
}

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
    back.resize(m);
    LW_ASSERT(round_trip(s, s.opts.dtype, x + off, m, back.data(), wire), "own encoding did not decode");
    residual->update(x + off, back.data(), m, off);
    std::copy(back.begin(), back.end(), x + off);
  }
}

/// comm.sparse_indices = "shared": v[0..k) becomes what the ring's int8 codec makes of it, chunk by chunk as
/// apply_error_feedback does. False if v held NaN or inf.
bool quantize_shared(const comm_state& s, float* v, size_t k) {
  const size_t chunk = s.opts.collective ? s.opts.shared_chunk : SIZE_MAX;
  std::vector<std::byte> wire;
  for (size_t off = 0, m = 0; off < k; off += m) {
    m = std::min(chunk, k - off);
    if (!round_trip(s, comm::wire_dtype::int8, v + off, m, v + off, wire)) return false;
  }
  return true;
}

/// Shared indices, one node's contribution (SparseLoCo's rule at the mask): e <- ef_decay * e + x, v =
/// e[mask] quantized as the int8 ring will, e[mask] -= v. False, e[mask] untouched, if v is not finite.
bool code_shared(const comm_state& s, comm::sparse_error_feedback& residual, const float* x,
                 const std::vector<size_t>& mask, float* v) {
  if (!residual.accumulate_and_gather(x, mask.data(), mask.size(), v) || !quantize_shared(s, v, mask.size()))
    return false;
  residual.subtract(mask.data(), mask.size(), v);
  return true;
}

/// The sparse residual under key for n values, created (zero) on first use or when n changed.
comm::sparse_error_feedback& sparse_residual(comm_state& s, uint32_t key, size_t n) {
  auto& residual = s.sparse_residuals[key];
  if (!residual || residual->size() != n)
    residual = std::make_unique<comm::sparse_error_feedback>(n, s.opts.ef_decay);
  return *residual;
}

/// comm.dtype = "sparse": error feedback encodes this node's contribution (weight 0 in an observed round:
/// sent without error feedback, and skipped by every node), the collective gathers every node's message, and
/// data becomes their rank-ordered mean (comm/sparse_sum.hpp).
void sparse_reduce(comm_state& s, uint64_t round, uint32_t part, float* data, size_t n, double weight) {
  const auto& o = s.opts.sparse;
  std::vector<std::byte> message(comm::sparse_encoded_size(n, o));
  auto t0 = std::chrono::steady_clock::now();
  if (weight > 0) {
    if (!sparse_residual(s, part, n).encode(data, n, 0, message.data(), o))
      throw lw_error(errc::diverged, "the error-feedback residual has NaN or infinite values");
  } else {
    comm::sparse_encode(data, n, message.data(), o);
  }
  s.sparse_encode_s += seconds_since(t0);
  const auto gathered = s.opts.collective->allgather(round, message.data(), message.size(), weight, part);
  std::string why;
  comm::sparse_mean_stats stats;
  t0 = std::chrono::steady_clock::now();
  const bool ok = comm::sparse_mean(gathered, n, o, s.opts.robust_clip, data, &why, &stats);
  s.sparse_decode_s += seconds_since(t0);
  if (!ok) throw lw_error(errc::malformed_frame, why);
  s.clipped += stats.clipped;
}

/// Key of worker w's residual for ring label part `part` in a single process (sparse_local).
uint32_t local_residual_key(size_t worker, uint32_t part) {
  LW_ASSERT(part < (1u << 16) && worker < (1u << 15), "sparse residual key out of range");
  return static_cast<uint32_t>(worker) << 16 | part;
}

/// A single process with comm.dtype = "sparse": each worker's contribution is encoded as the node of one
/// worker that it stands for would encode it (its own error feedback), so a local run measures the codec and
/// equals a cluster of one-worker nodes. sparse_mean of the result is that cluster's average.
bool sparse_local(comm_state& s, uint32_t part, const std::vector<at::Tensor>& parts, comm::gathered& g) {
  const auto& o = s.opts.sparse;
  const auto n = static_cast<size_t>(parts[0].numel());
  g.bytes = comm::sparse_encoded_size(n, o);
  g.weights.assign(parts.size(), 1.0);
  g.messages.resize(parts.size() * g.bytes);
  const auto t0 = std::chrono::steady_clock::now();
  bool finite = true;
  for (size_t w = 0; w < parts.size(); ++w) {
    const auto x = parts[w].to(at::kFloat).contiguous();
    auto& residual = sparse_residual(s, local_residual_key(w, part), n);
    finite = residual.encode(x.data_ptr<float>(), n, 0, g.messages.data() + w * g.bytes, o) && finite;
  }
  s.sparse_encode_s += seconds_since(t0);
  return finite;
}

/// comm.sparse_indices = "shared" in a cluster (SparseLoCo's rule with a shared mask): e <- ef_decay * e +
/// data, v = e[mask] quantized as the int8 ring will, e[mask] -= v; the ring averages every node's v (the
/// same indices everywhere, so they add up on the way and the bytes do not grow with the nodes), and data
/// becomes 0 except data[mask] = that average. Weight 0 (an observed round): v = data[mask], e untouched.
void shared_reduce(comm_state& s, uint64_t round, uint32_t part, float* data, size_t n, double weight) {
  const auto mask = comm::shared_mask(n, s.opts.sparse, {s.opts.mask_seed, round, part});
  const size_t k = mask.size();
  std::vector<float> v(k);
  const auto t0 = std::chrono::steady_clock::now();
  if (weight > 0) {
    if (!code_shared(s, sparse_residual(s, part, n), data, mask, v.data()))
      throw lw_error(errc::diverged, "the error-feedback residual has NaN or infinite values");
  } else {
    for (size_t i = 0; i < k; ++i) v[i] = data[mask[i]];
  }
  s.sparse_encode_s += seconds_since(t0);
  s.opts.collective->allreduce(round, v.data(), k, weight, part, comm::wire_dtype::int8);
  std::fill(data, data + n, 0.0f);
  for (size_t i = 0; i < k; ++i) data[mask[i]] = v[i];
}

/// comm.sparse_indices = "shared" in a single process: each worker's v is built and quantized as a node of
/// one worker would (its own residual, key local_residual_key), and *mean = the workers' quantized v summed
/// in rank order over the workers' count. A cluster of one-worker nodes gets the same up to the ring's
/// re-quantization of partial sums. False if a residual went non-finite.
bool shared_local(comm_state& s, const ring_label& label, const std::vector<at::Tensor>& parts,
                  const std::vector<size_t>& mask, std::vector<float>* mean) {
  const auto n = static_cast<size_t>(parts[0].numel());
  const size_t k = mask.size();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> v(k);
  mean->assign(k, 0.0f);
  bool finite = true;
  for (size_t w = 0; w < parts.size(); ++w) {
    const auto x = parts[w].to(at::kFloat).contiguous();
    if (!code_shared(s, sparse_residual(s, local_residual_key(w, label.second), n), x.data_ptr<float>(), mask,
                     v.data())) {
      finite = false;
      continue;
    }
    for (size_t i = 0; i < k; ++i) (*mean)[i] += v[i];
  }
  const float inv = 1.0f / static_cast<float>(parts.size());
  for (float& m : *mean) m *= inv;
  s.sparse_encode_s += seconds_since(t0);
  return finite;
}

/// Values that comm.dtype = "sparse" sends out of n (top-k or shared: the same count per chunk).
size_t kept_of(const comm_state& s, size_t n) {
  const size_t c = s.opts.sparse.chunk;
  return n / c * comm::sparse_kept(c, s.opts.sparse) + comm::sparse_kept(n % c, s.opts.sparse);
}

/// Fraction of n values that the wire carries in dtype.
double density_of(const comm_state& s, comm::wire_dtype dtype, size_t n) {
  if (dtype != comm::wire_dtype::sparse || n == 0) return 1.0;
  return static_cast<double>(kept_of(s, n)) / static_cast<double>(n);
}

/// Bytes that n values take on the wire in dtype (the compression ratio compares them with fp32's).
size_t wire_bytes_of(const comm_state& s, comm::wire_dtype dtype, size_t n) {
  if (dtype != comm::wire_dtype::sparse) return comm::encoded_size(dtype, n, s.opts.codec);
  if (s.opts.shared_indices) return comm::encoded_size(comm::wire_dtype::int8, kept_of(s, n), s.opts.codec);
  return comm::sparse_encoded_size(n, s.opts.sparse);
}

/// L2 norm of the error-feedback residuals of a ring label part (every local worker's, in a single process),
/// if there are any.
std::optional<double> residual_norm(const comm_state& s, uint32_t part) {
  double sum = 0;
  bool any = false;
  auto add = [&](uint32_t key, const std::vector<float>& r) {
    if ((key & 0xffffu) != part) return;
    any = true;
    for (const float v : r) sum += static_cast<double>(v) * v;
  };
  for (const auto& [key, ef] : s.residuals)
    if (ef) add(key, ef->residual());
  for (const auto& [key, ef] : s.sparse_residuals)
    if (ef) add(key, ef->residual());
  if (!any) return std::nullopt;
  return std::sqrt(sum);
}

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

/// dtype: what this reduce used on the wire (comm.dtype, or fp32 for an exact one).
template <class Self>
void report(Self* self, comm_state& s, const ring_label& label, size_t n, double seconds,
            comm::wire_dtype dtype) {
  if (!s.opts.metrics) return;
  auto& m = s.opts.metrics;
  self->send(m, observe_atom_v, std::string("longwave_allreduce_seconds"), std::string(), seconds);
  uint64_t sent = 0, received = 0;
  double ratio = 1.0;
  std::pair<double, double> waits{0, 0};
  if (s.opts.collective) {
    waits = report_waits(self, s, label, seconds);
    sent = s.opts.collective->bytes_sent() - s.sent;
    received = s.opts.collective->bytes_received() - s.received;
    s.sent += sent;
    s.received += received;
    self->send(m, count_atom_v, std::string("longwave_comm_bytes_sent_total"), "peer=" + s.opts.next_peer,
               static_cast<double>(sent));
    self->send(m, count_atom_v, std::string("longwave_comm_bytes_received_total"), "peer=" + s.opts.prev_peer,
               static_cast<double>(received));
  }
  // A single process codes only for comm.dtype = "sparse" (sparse_local).
  if (s.opts.collective || dtype == comm::wire_dtype::sparse) {
    const auto wire = wire_bytes_of(s, dtype, n);
    if (wire > 0) ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(wire);
    double enc = s.sparse_encode_s, dec = s.sparse_decode_s;
    if (s.opts.collective) {
      enc += s.opts.collective->encode_seconds();
      dec += s.opts.collective->decode_seconds();
    }
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
  self->send(m, gauge_atom_v, std::string("longwave_comm_density"), std::string(), density_of(s, dtype, n));
  if (const auto norm = residual_norm(s, label.second))
    self->send(m, gauge_atom_v, std::string("longwave_comm_residual_norm"), std::string(), *norm);
  if (s.clipped > s.clipped_reported) {
    self->send(m, count_atom_v, std::string("longwave_comm_clipped_total"), std::string(),
               static_cast<double>(s.clipped - s.clipped_reported));
    s.clipped_reported = s.clipped;
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
                 .add("dtype", config::to_string(dtype))
                 .str());
}

using self_ptr = communicator_actor::stateful_pointer<comm_state>;

/// t itself when nobody else holds it (a worker's fresh pseudo-gradient) and it is contiguous fp32, else a
/// contiguous fp32 copy (ddp's gradient buffer, eager's outer parameters): a tensor the caller may write.
at::Tensor writable(at::Tensor t) {
  if (t.use_count() == 1 && t.storage().use_count() == 1 && t.scalar_type() == at::kFloat &&
      t.is_contiguous())
    return t;
  return t.to(at::kFloat).clone().contiguous();
}

/// exact: fp32 on the wire whatever comm.dtype is, and no error feedback (parameters, not pseudo-gradients).
/// contributors: the node's weight (-1: one per part; 0: it only relays, as a joiner's observed round).
caf::result<at::Tensor> reduce(self_ptr self, const ring_label& label, std::vector<at::Tensor> parts,
                               bool exact, int64_t contributors) {
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
  models::no_grad_guard no_grad;
  std::optional<comm::gathered> local;
  std::vector<size_t> mask;        // shared indices in a single process
  std::vector<float> shared_mean;  // and the workers' mean at them
  bool local_finite = true;
  // A non-finite contribution is not coded: no residual takes it in, and the mean's check below fails the
  // round.
  if (!s.opts.collective && !exact && dtype == comm::wire_dtype::sparse &&
      std::all_of(parts.begin(), parts.end(), [](const at::Tensor& p) { return all_finite(p); })) {
    if (s.opts.shared_indices) {
      mask =
          comm::shared_mask(static_cast<size_t>(n), s.opts.sparse, {s.opts.mask_seed, round, label.second});
      local_finite = shared_local(s, label, parts, mask, &shared_mean);
    } else {
      local.emplace();
      local_finite = sparse_local(s, label.second, parts, *local);
    }
  }
  // In one process, fp16, bf16 and int8 round each worker's contribution as a node's encoding would (one
  // codec chunk over the whole tensor), in a writable tensor.
  if (!s.opts.collective && !exact && dtype != comm::wire_dtype::fp32 && dtype != comm::wire_dtype::sparse) {
    std::vector<std::byte> wire;
    for (auto& p : parts) {
      p = writable(std::move(p));
      float* x = p.data_ptr<float>();
      local_finite = local_finite && round_trip(s, dtype, x, static_cast<size_t>(n), x, wire);
    }
  }
  // The sum goes into the first contribution when it is writable, else into a copy.
  auto sum = writable(std::move(parts[0]));
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
  if (!local_finite)
    return make_error(errc::diverged, "round " + std::to_string(round) +
                                          ": the error-feedback residual has NaN or infinite values");
  if (!mask.empty()) {
    sum.zero_();
    float* data = sum.data_ptr<float>();
    for (size_t i = 0; i < mask.size(); ++i) data[mask[i]] = shared_mean[i];
  }
  if (local) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string why;
    comm::sparse_mean_stats stats;
    if (!comm::sparse_mean(*local, static_cast<size_t>(n), s.opts.sparse, s.opts.robust_clip,
                           sum.data_ptr<float>(), &why, &stats))
      return make_error(errc::malformed_frame, "round " + std::to_string(round) + ": " + why);
    s.sparse_decode_s += seconds_since(t0);
    s.clipped += stats.clipped;
  }
  if (s.opts.collective) {
    float* data = sum.data_ptr<float>();
    const bool observe = (s.opts.observe_round > 0 && round == s.opts.observe_round) || contributors == 0;
    if (s.opts.error_feedback && dtype != comm::wire_dtype::fp32 && dtype != comm::wire_dtype::sparse &&
        !observe)
      apply_error_feedback(s, label.second, data, static_cast<size_t>(n));
    const double weight =
        observe ? 0.0
                : static_cast<double>(contributors > 0 ? contributors : static_cast<int64_t>(parts.size()));
    try {
      if (dtype == comm::wire_dtype::sparse && s.opts.shared_indices)
        shared_reduce(s, round, label.second, data, static_cast<size_t>(n), weight);
      else if (dtype == comm::wire_dtype::sparse)
        sparse_reduce(s, round, label.second, data, static_cast<size_t>(n), weight);
      else
        s.opts.collective->allreduce(round, data, static_cast<size_t>(n), weight, label.second, dtype);
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
  auto add = [&](uint32_t label, const std::vector<float>& r) {
    auto t = at::empty({static_cast<int64_t>(r.size())}, at::kFloat);
    std::copy(r.begin(), r.end(), t.data_ptr<float>());
    out.emplace(label, std::move(t));
  };
  for (const auto& [label, ef] : s.residuals)
    if (ef) add(label, ef->residual());
  for (const auto& [label, ef] : s.sparse_residuals)
    if (ef) add(label, ef->residual());
  return out;
}

communicator_actor::behavior_type communicator_fun(self_ptr self, communicator_options opts) {
  self->state.opts = std::move(opts);
  return {
      [=](state_atom) -> caf::result<residual_map> { return residuals_of(self->state); },
      [=](load_atom, const residual_map& residuals) -> caf::result<bool> {
        auto& s = self->state;
        s.residuals.clear();
        s.sparse_residuals.clear();
        for (const auto& [label, t] : residuals) {
          const auto c = t.to(at::kFloat).contiguous();
          const float* p = c.data_ptr<float>();
          std::vector<float> r(p, p + c.numel());
          if (s.opts.dtype == comm::wire_dtype::sparse)
            s.sparse_residuals[label] =
                std::make_unique<comm::sparse_error_feedback>(std::move(r), s.opts.ef_decay);
          else
            s.residuals[label] = std::make_unique<comm::error_feedback>(std::move(r));
        }
        return true;
      },
      // By reference into the message, so that the tensors are moved out of it (see reduce).
      [=](reduce_atom, reduce_request& req) {
        return reduce(self, req.label, std::move(req.parts), req.exact, req.contributors);
      },
  };
}

}  // namespace

communicator_actor spawn_communicator(caf::actor_system& sys, communicator_options opts) {
  return sys.spawn<caf::detached>(communicator_fun, std::move(opts));
}

}  // namespace longwave::actors
