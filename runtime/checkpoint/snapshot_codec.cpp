// Checkpoint layout: blobs "theta", "momentum" (absent before the first outer step), "pending" (delayed
// policy: the average of round pending_round, not yet applied) and per replica r
// "replica<r>/master", "/exp_avg", "/exp_avg_sq", "/counters" (adam_steps, sampler_position, steps_in_round
// as three int64), and under diloco.outer = "eager" "/outer_theta", "/outer_momentum" (once it exists) and
// "/prev_delta"; with comm.error_feedback "ef/<label>", the node's residual for that ring label (a
// fragment's size under streaming); under diloco.outer = "async" "dn_buffer" (Delayed Nesterov's period
// buffer, once it holds one). meta holds "key=value" lines: mode, preset, n_params, replicas, pending_round,
// outer (diloco.outer), version, merged_tokens and dn_arrivals (async: theta's version, the tokens merged
// into it, the contributions in dn_buffer).
#include "runtime/checkpoint/snapshot_codec.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "runtime/errors/errors.hpp"
#include "runtime/tensor/tensor_checks.hpp"

namespace longwave::runtime {

namespace {

checkpoint_blob tensor_blob(std::string name, const at::Tensor& t) {
  LW_ASSERT(t.is_contiguous() && t.scalar_type() == at::kFloat, "snapshot tensors must be contiguous fp32");
  checkpoint_blob b;
  b.name = std::move(name);
  auto holder = std::make_shared<at::Tensor>(t);
  b.data = holder->data_ptr();
  b.size = static_cast<size_t>(holder->numel()) * sizeof(float);
  b.owner = std::shared_ptr<const void>(holder, holder->data_ptr());
  return b;
}

checkpoint_blob counters_blob(std::string name, std::vector<int64_t> values) {
  checkpoint_blob b;
  b.name = std::move(name);
  auto holder = std::make_shared<std::vector<int64_t>>(std::move(values));
  b.data = holder->data();
  b.size = holder->size() * sizeof(int64_t);
  b.owner = holder;
  return b;
}

[[noreturn]] void mismatch(const std::string& what) {
  throw lw_error(errc::corrupt_checkpoint, what);
}

at::Tensor tensor_from(const checkpoint& c, const std::string& name, int64_t n) {
  const auto* b = c.find(name);
  if (!b) mismatch("checkpoint has no '" + name + "'");
  if (b->size != static_cast<size_t>(n) * sizeof(float))
    mismatch("checkpoint '" + name + "' holds " +
             (b->size % sizeof(float) == 0 ? std::to_string(b->size / sizeof(float)) + " values"
                                           : std::to_string(b->size) + " bytes, not whole fp32 values") +
             ", this model has " + std::to_string(n));
  auto t = at::empty({n}, at::kFloat);
  if (n > 0) std::memcpy(t.data_ptr(), b->data, b->size);
  return t;
}

}  // namespace

std::map<std::string, std::string> parse_meta(const std::string& meta) {
  std::map<std::string, std::string> kv;
  std::istringstream in(meta);
  std::string line;
  while (std::getline(in, line)) {
    if (line + "\n" == config_marker) break;
    auto eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

checkpoint to_checkpoint(const train_snapshot& s, const snapshot_shape& shape) {
  checkpoint c;
  c.round = s.round;
  c.step = s.step;
  std::ostringstream meta;
  meta << "mode=" << shape.mode << "\npreset=" << shape.preset << "\nn_params=" << shape.n_params
       << "\nreplicas=" << s.replicas.size() << "\npending_round=" << s.pending_round
       << "\nouter=" << shape.outer << "\nversion=" << s.version << "\nmerged_tokens=" << s.merged_tokens
       << "\ndn_arrivals=" << s.dn_arrivals << "\n";
  if (shape.data != 0) meta << "data=" << shape.data << "\n";
  if (shape.data_parts != 0)
    meta << "data_parts=" << shape.data_parts << "\nrank_offset=" << shape.rank_offset << "\n";
  if (!shape.tokenizer.empty()) meta << "tokenizer=" << shape.tokenizer << "\n";
  meta << s.meta;
  c.meta = meta.str();
  if (shape.tokenizer_text) {
    checkpoint_blob b;
    b.name = "tokenizer";
    b.owner = shape.tokenizer_text;
    b.data = shape.tokenizer_text->data();
    b.size = shape.tokenizer_text->size();
    c.blobs.push_back(std::move(b));
  }
  c.blobs.push_back(tensor_blob("theta", s.theta));
  if (s.momentum.defined()) c.blobs.push_back(tensor_blob("momentum", s.momentum));
  if (s.pending.defined()) c.blobs.push_back(tensor_blob("pending", s.pending));
  if (s.dn_buffer.defined()) c.blobs.push_back(tensor_blob("dn_buffer", s.dn_buffer));
  for (const auto& r : s.replicas) {
    const std::string p = "replica" + std::to_string(r.rank) + "/";
    c.blobs.push_back(tensor_blob(p + "master", r.master));
    c.blobs.push_back(tensor_blob(p + "exp_avg", r.exp_avg));
    c.blobs.push_back(tensor_blob(p + "exp_avg_sq", r.exp_avg_sq));
    c.blobs.push_back(counters_blob(
        p + "counters", {r.adam_steps, static_cast<int64_t>(r.sampler_position), r.steps_in_round}));
    if (r.outer_theta.defined()) c.blobs.push_back(tensor_blob(p + "outer_theta", r.outer_theta));
    if (r.outer_momentum.defined()) c.blobs.push_back(tensor_blob(p + "outer_momentum", r.outer_momentum));
    if (r.prev_delta.defined()) c.blobs.push_back(tensor_blob(p + "prev_delta", r.prev_delta));
  }
  for (const auto& [label, t] : s.residuals) c.blobs.push_back(tensor_blob("ef/" + std::to_string(label), t));
  return c;
}

std::optional<replica_counters> counters_of(const checkpoint& c, int64_t r) {
  const auto* b = c.find("replica" + std::to_string(r) + "/counters");
  if (!b || b->size != 3 * sizeof(int64_t)) return std::nullopt;
  int64_t v[3];
  std::memcpy(v, b->data, sizeof(v));
  return replica_counters{v[0], v[1], v[2]};
}

std::string shape_problem(const checkpoint& c, const snapshot_shape& shape) {
  auto kv = parse_meta(c.meta);
  // First: another tokenizer also changes the vocabulary and so the parameter count.
  if (const auto it = kv.find("tokenizer");
      it != kv.end() && !shape.tokenizer.empty() && it->second != shape.tokenizer)
    return "checkpoint was trained with the tokenizer '" + it->second + "', this run prepared '" +
           shape.tokenizer +
           "' (data.path, data.tokenizer or data.bpe_vocab_size changed, or the corpus did and its BPE was "
           "trained again): its token ids would stand for other text. Resume with the corpus and data "
           "settings the run began with";
  if (kv["mode"] != shape.mode)
    return "checkpoint was written in mode '" + kv["mode"] + "', this run is '" + shape.mode + "'";
  if (kv["preset"] != shape.preset)
    return "checkpoint was written for model '" + kv["preset"] + "', this run uses '" + shape.preset + "'";
  if (kv["replicas"] != std::to_string(shape.n_replicas))
    return "checkpoint was written for " + kv["replicas"] + " workers, this run has " +
           std::to_string(shape.n_replicas);
  // Older checkpoints carry no outer=: they were not asynchronous.
  const std::string outer = kv.count("outer") ? kv["outer"] : std::string("sync");
  if ((outer == "async") != (shape.outer == "async"))
    return "checkpoint was written with diloco.outer = \"" + outer + "\", this run is \"" + shape.outer +
           "\": an asynchronous run's versions and a round's barrier do not resume each other";
  const auto* theta = c.find("theta");
  if (theta && theta->size % sizeof(float) == 0 &&
      theta->size != static_cast<size_t>(shape.n_params) * sizeof(float))
    return "checkpoint 'theta' holds " + std::to_string(theta->size / sizeof(float)) +
           " values, this model has " + std::to_string(shape.n_params);
  return "";
}

std::string split_change(const std::string& meta, const snapshot_shape& shape) {
  auto kv = parse_meta(meta);
  if (!kv.count("data_parts") || !kv.count("rank_offset") || shape.data_parts == 0) return "";
  const int64_t parts = std::strtoll(kv["data_parts"].c_str(), nullptr, 10),
                offset = std::strtoll(kv["rank_offset"].c_str(), nullptr, 10);
  if (parts == shape.data_parts && offset == shape.rank_offset) return "";
  const auto read = [&](int64_t first) {
    return shape.n_replicas == 1 ? fmt::format("part {}", first)
                                 : fmt::format("parts {}..{}", first, first + shape.n_replicas - 1);
  };
  const auto of = [&](int64_t first, int64_t n) { return fmt::format("{} of {}", read(first), n); };
  return fmt::format(
      "data: this node's workers read {} of the training data when the checkpoint was written, and now {} "
      "(nodes were added to, removed from or moved in the cluster file). Each worker goes on in its new part "
      "at its old position, so this is no longer an exact resume",
      of(offset, parts), of(shape.rank_offset, shape.data_parts));
}

train_snapshot from_checkpoint(checkpoint&& c, const snapshot_shape& shape) {
  if (const auto problem = shape_problem(c, shape); !problem.empty()) mismatch(problem);
  auto kv = parse_meta(c.meta);
  train_snapshot s;
  s.round = c.round;
  s.step = c.step;
  s.meta = c.meta;
  s.theta = tensor_from(c, "theta", shape.n_params);
  if (c.find("momentum")) s.momentum = tensor_from(c, "momentum", shape.n_params);
  if (c.find("dn_buffer")) s.dn_buffer = tensor_from(c, "dn_buffer", shape.n_params);
  s.version = std::strtoull(kv["version"].c_str(), nullptr, 10);
  s.merged_tokens = std::strtoull(kv["merged_tokens"].c_str(), nullptr, 10);
  s.dn_arrivals = std::strtoll(kv["dn_arrivals"].c_str(), nullptr, 10);
  if (c.find("pending")) {
    s.pending = tensor_from(c, "pending", shape.n_params);
    s.pending_round = std::strtoull(kv["pending_round"].c_str(), nullptr, 10);
  }
  for (int64_t r = 0; r < shape.n_replicas; ++r) {
    const std::string p = "replica" + std::to_string(r) + "/";
    replica_state rs;
    rs.rank = r;
    rs.master = tensor_from(c, p + "master", shape.n_params);
    rs.exp_avg = tensor_from(c, p + "exp_avg", shape.n_params);
    rs.exp_avg_sq = tensor_from(c, p + "exp_avg_sq", shape.n_params);
    const auto v = counters_of(c, r);
    if (!v) mismatch("checkpoint has no valid '" + p + "counters'");
    if (v->adam_steps < 0 || v->sampler_position < 0 || v->steps_in_round < 0)  // a run could not write them
      mismatch("checkpoint '" + p + "counters' hold a negative count (" + std::to_string(v->adam_steps) +
               " inner steps, data position " + std::to_string(v->sampler_position) + ", step " +
               std::to_string(v->steps_in_round) + " of the round)");
    constexpr int64_t most = max_replica_count;
    if (v->adam_steps > most || v->sampler_position > most || v->steps_in_round > most)
      mismatch("checkpoint '" + p + "counters' hold a count no run reaches (" +
               std::to_string(v->adam_steps) + " inner steps, data position " +
               std::to_string(v->sampler_position) + ", step " + std::to_string(v->steps_in_round) +
               " of the round; at most 2^40)");
    rs.adam_steps = v->adam_steps;
    rs.sampler_position = static_cast<uint64_t>(v->sampler_position);
    rs.steps_in_round = v->steps_in_round;
    for (auto [name, t] :
         {std::pair{"outer_theta", &rs.outer_theta}, std::pair{"outer_momentum", &rs.outer_momentum},
          std::pair{"prev_delta", &rs.prev_delta}})
      if (c.find(p + name)) *t = tensor_from(c, p + name, shape.n_params);
    s.replicas.push_back(std::move(rs));
  }
  for (const auto& b : c.blobs) {
    if (b.name.rfind("ef/", 0) != 0) continue;
    uint32_t label = 0;
    const auto *first = b.name.data() + 3, *last = b.name.data() + b.name.size();
    const auto [end, ec] = std::from_chars(first, last, label);
    if (ec != std::errc() || end != last || first == last)
      mismatch("checkpoint has an error-feedback blob with a malformed name '" + b.name + "'");
    const int64_t n = static_cast<int64_t>(b.size / sizeof(float));
    if (b.size % sizeof(float) != 0 || n > shape.n_params)
      mismatch("checkpoint '" + b.name + "' holds " + std::to_string(b.size) + " bytes, not at most " +
               std::to_string(shape.n_params) + " fp32 values");
    s.residuals.emplace(label, tensor_from(c, b.name, n));
  }
  if (const auto bad = first_non_finite(s); !bad.empty())
    mismatch("checkpoint '" + bad + "' holds NaN or infinite values, which no run writes");
  return s;
}

std::string first_non_finite(const train_snapshot& snap) {
  auto bad = [](const at::Tensor& t) { return !all_finite(t); };
  if (bad(snap.theta)) return "theta";
  if (bad(snap.momentum)) return "momentum";
  if (bad(snap.pending)) return "pending";
  if (bad(snap.dn_buffer)) return "dn_buffer";
  for (const auto& r : snap.replicas) {
    const std::string p = "replica" + std::to_string(r.rank) + "/";
    for (auto [name, t] :
         {std::pair{"master", &r.master}, std::pair{"exp_avg", &r.exp_avg},
          std::pair{"exp_avg_sq", &r.exp_avg_sq}, std::pair{"outer_theta", &r.outer_theta},
          std::pair{"outer_momentum", &r.outer_momentum}, std::pair{"prev_delta", &r.prev_delta}})
      if (bad(*t)) return p + name;
  }
  for (const auto& [label, t] : snap.residuals)
    if (bad(t)) return "ef/" + std::to_string(label);
  return "";
}

}  // namespace longwave::runtime
