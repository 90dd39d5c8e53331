// The run's files: its paths, the checkpoint it resumes from, and the trace and config it rewrites.
#include "actors/run_files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <vector>

#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/files/atomic_file.hpp"
#include "runtime/json/json_pretty.hpp"
#include "runtime/json/json_reader.hpp"
#include "runtime/log/log.hpp"

namespace fs = std::filesystem;

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

/// Whether `line` reads as the trace writes it: step, round, loss, tab-separated
/// (actors/coordinator/progress).
bool trace_line(const std::string& line, uint64_t* step) {
  const auto t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
  if (t2 == std::string::npos || line.find('\t', t2 + 1) != std::string::npos) return false;
  const auto whole = [](const std::string& w) {
    return !w.empty() && w.size() <= 19 && w.find_first_not_of("0123456789") == std::string::npos;
  };
  const auto step_text = line.substr(0, t1), loss = line.substr(t2 + 1);
  char* end = nullptr;
  std::strtod(loss.c_str(), &end);
  if (!whole(step_text) || !whole(line.substr(t1 + 1, t2 - t1 - 1)) || loss.empty() ||
      end != loss.c_str() + loss.size())
    return false;
  *step = std::strtoull(step_text.c_str(), nullptr, 10);
  return true;
}

/// `path` + ".damaged", or + ".damaged-2", ... : the first name not taken.
std::string damaged_name(const std::string& path) {
  std::error_code ec;
  std::string name = path + ".damaged";
  for (int i = 2; fs::exists(fs::symlink_status(name, ec)); ++i)
    name = path + ".damaged-" + std::to_string(i);
  return name;
}

// Keeps the lines of an earlier trace up to `step` (a resume rewrites the steps after its checkpoint).
/// Whether the trace now ends at `step`: a trace that could not be cut back is not appended to. Lines that
/// are not the trace's (a damaged file) are dropped, the file as it was kept beside it and named.
bool truncate_trace(const std::string& path, uint64_t step) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream keep;
  std::string line;
  size_t damaged = 0, first_damaged = 0, n = 0;
  while (std::getline(in, line)) {
    ++n;
    uint64_t at = 0;
    if (!trace_line(line, &at)) {
      // A last line without its line break is a write a kill cut short, past the checkpoint: no damage.
      if (in.eof()) {
        --n;
        break;
      }
      if (damaged++ == 0) first_damaged = n;
      continue;
    }
    if (at <= step) keep << line << '\n';
  }
  in.close();
  std::string aside;
  if (damaged > 0) {  // kept whole beside it: the lines dropped may matter to whoever damaged it
    aside = damaged_name(path);
    std::error_code ec;
    fs::copy_file(path, aside, ec);
    if (ec) aside.clear();
  }
  // Replaced whole or not at all: a crash here must not leave the earlier trace cut short.
  if (const auto problem = write_atomically(path, keep.str()); !problem.empty()) {
    spdlog::warn(
        "loss trace {} not cut back to step {}: {}; this session does not write it (its steps would follow "
        "the later ones there)",
        path, step, problem);
    if (std::error_code ec; !aside.empty()) fs::remove(aside, ec);
    return false;
  }
  if (damaged > 0)
    spdlog::warn(
        "loss trace {}: {} of its {} lines are not step<TAB>round<TAB>loss (the first is line {}): dropped; "
        "{}",
        path, damaged, n, first_damaged,
        aside.empty() ? "the file could not be copied aside" : "the file as it was is kept as " + aside);
  return true;
}

/// Whether `path` begins as every config copy a run writes does (config::resolved_config_header).
bool resolved_copy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(config::resolved_config_header.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return in && head == config::resolved_config_header;
}

/// Says what the checkpoint directory holds besides checkpoints, and removes unfinished writes (a process
/// that died mid-write leaves a .tmp, which the lock shows is nobody's now). Returns whether there was any.
bool report_stray_files(const checkpoint_store& store) {
  const auto strays = store.stray_files();
  for (const auto& f : strays) {
    std::error_code ec;
    if (f.unfinished_write && fs::remove(f.path, ec))
      spdlog::warn("checkpoint: removed {}: {}", f.path, f.reason);
    else
      spdlog::warn("checkpoint: ignoring {}: {}", f.path, f.reason);
  }
  return !strays.empty();
}

/// A checkpoint of train.rounds completed rounds or more: the run is done. One inside a later round
/// (train.rounds was lowered) is done too: its theta_global is that of a completed round past the end.
bool run_complete(const train_snapshot& snap, const config::train_config& cfg) {
  // async: train.rounds counts versions (and async.tokens may end the run first); a node's rounds are its
  // own, so a replica in the middle of one still has steps to do.
  const bool async = cfg.diloco.outer == config::outer_policy_kind::async;
  const bool tokens_done =
      async && cfg.async.tokens > 0 && snap.merged_tokens >= static_cast<uint64_t>(cfg.async.tokens);
  if ((async ? snap.version : snap.round) < static_cast<uint64_t>(cfg.train.rounds) && !tokens_done)
    return false;
  if (async)
    for (const auto& r : snap.replicas)
      if (r.steps_in_round != 0) return false;
  return true;
}

/// A cluster node's checkpoints of `from_round` and later, which are not of the cluster's training history
/// (it resumes, or fetched a state, at an earlier round): set aside, so that neither a resume nor `keep`
/// takes them for the node's newest. `why` completes "moved to DIR/ (NAMES): ...".
void set_aside_from(const checkpoint_store& store, uint64_t from_round, const std::string& why) {
  std::vector<std::string> pruned;
  const auto moved = store.set_aside(from_round, &pruned);
  if (moved.empty()) return;
  std::string names;
  for (const auto& m : moved) names += (names.empty() ? "" : ", ") + fs::path(m).filename().string();
  spdlog::warn("checkpoint: {} of round {} and later moved to {}/ ({}): {}",
               moved.size() == 1 ? "1 file" : fmt::format("{} files", moved.size()), from_round,
               fs::path(moved.front()).parent_path().string(), names, why);
  if (!pruned.empty())
    spdlog::info("checkpoint: removed {} older set{} of superseded checkpoints ({}; checkpoint.keep = {})",
                 pruned.size(), pruned.size() == 1 ? "" : "s", fmt::join(pruned, ", "), store.keep());
}

}  // namespace

void set_aside_corrupt(const checkpoint_store& store, const std::vector<std::string>& files) {
  for (const auto& f : files) {
    try {
      const auto to = store.set_aside_corrupt(f);
      if (fs::path(to).parent_path().filename() == other_build_dir_name)
        spdlog::warn(
            "checkpoint: moved {} to {} (another build's format: this run goes on from an older checkpoint "
            "and would write over it; move it back for that build to resume from it)",
            fs::path(f).filename().string(), to);
      else
        spdlog::warn("checkpoint: moved {} to {} (it fails its checks; nothing reads it there)",
                     fs::path(f).filename().string(), to);
    } catch (const lw_error& e) {
      spdlog::warn("checkpoint: {} stays where it is: {}", fs::path(f).filename().string(), e.what());
    }
  }
}

namespace {

/// The newest valid checkpoint of at most `max_round` completed rounds (a cluster's agreed round). Newer ones
/// are another history than the cluster's: the caller sets them aside. Files that fail their checks are added
/// to `corrupt`; every file skipped is counted in `skipped`.
std::optional<checkpoint> load_at_most(const checkpoint_store& store, uint64_t max_round, int* skipped,
                                       std::vector<std::string>* corrupt) {
  const auto files = store.list();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      auto c = checkpoint_store::load_file(*it);
      if (c.round > max_round) continue;
      spdlog::info("resuming from {} (the cluster resumes after round {})", *it, max_round);
      return c;
    } catch (const lw_error& e) {
      spdlog::warn("checkpoint {} skipped: {}", *it, e.what());
      ++*skipped;
      if (e.code() == errc::corrupt_checkpoint) corrupt->push_back(*it);
    }
  }
  if (max_round > 0)
    throw lw_error(
        errc::corrupt_checkpoint,
        fmt::format("the cluster resumes after round {}, but {} holds no valid checkpoint at or before "
                    "it; restore one, or start every node with --fresh",
                    max_round, store.dir()));
  if (!files.empty())
    throw lw_error(
        errc::invalid_config,
        fmt::format("this node has checkpoints in {} but another node has none, so the cluster would "
                    "start over; start every node with --fresh, or restore the other nodes' checkpoints",
                    store.dir()));
  return std::nullopt;
}

/// A resume under training settings other than its checkpoint's run had (train.seed, batch_size, lr, ...)
/// goes on, but is no longer that run continued: says which. train.rounds and async.tokens may grow freely.
/// A checkpoint that stopped mid-round past a lowered train.inner_steps ends that round at once: says so.
void warn_changed_settings(const config::train_config& cfg, const train_snapshot& snap) {
  // (Streaming has no such point: its policy refuses the resume.)
  if (!snap.replicas.empty() && snap.replicas[0].steps_in_round > cfg.train.inner_steps &&
      cfg.diloco.outer != config::outer_policy_kind::async &&
      cfg.diloco.outer != config::outer_policy_kind::streaming)
    spdlog::warn(
        "the checkpoint is {} inner steps into round {}, and train.inner_steps = {} now: that round ends "
        "at once with the {} steps it has (the rounds after have {})",
        snap.replicas[0].steps_in_round, snap.round + 1, cfg.train.inner_steps,
        snap.replicas[0].steps_in_round, cfg.train.inner_steps);
  std::string then;
  try {
    then = config::training_settings(config_of(snap.meta, "the checkpoint"));
  } catch (const std::exception& e) {  // an older file without a config, or one this build does not parse
    spdlog::warn("the checkpoint's settings are not compared with this run's: {}", e.what());
    return;
  }
  std::vector<std::string> changed;
  // "key = NOW (THEN)" -> "key = NOW (it had THEN)"
  for (auto& d : config::settings_differences(config::training_settings(cfg), then, 64))
    if (d.rfind("train.rounds ", 0) != 0 && d.rfind("async.tokens ", 0) != 0)
      changed.push_back(d.insert(d.rfind(" (") + 2, "it had "));
  if (changed.empty()) return;
  std::string list;
  for (size_t i = 0; i < changed.size() && i < 5; ++i) list += (i ? ", " : "") + changed[i];
  if (changed.size() > 5) list += fmt::format(" and {} more", changed.size() - 5);
  spdlog::warn(
      "resuming with {} other than the checkpoint's run had: {}. The run goes on with them, so it is no "
      "longer an exact resume",
      changed.size() == 1 ? "a training setting" : fmt::format("{} training settings", changed.size()), list);
}

/// Nothing to train: says so, and how to get the final validation loss when result.json is missing.
void report_complete(const config::train_config& cfg, const run_paths& p, const train_snapshot& snap) {
  if (cfg.diloco.outer == config::outer_policy_kind::async) {  // versions and tokens, not this node's phases
    const bool by_tokens =
        cfg.async.tokens > 0 && snap.merged_tokens >= static_cast<uint64_t>(cfg.async.tokens);
    spdlog::info(
        "run complete: {} already holds version {} ({}); nothing to train. Raise {} to train more, or pass "
        "--fresh to start over",
        p.out_dir, snap.version,
        by_tokens ? fmt::format("{} merged tokens of async.tokens = {}", snap.merged_tokens, cfg.async.tokens)
                  : fmt::format("train.rounds = {} versions", cfg.train.rounds),
        by_tokens ? "async.tokens" : "train.rounds");
  } else {
    spdlog::info(
        "run complete: {} already holds round {} of train.rounds = {} (inner step {}{}); nothing to train. "
        "Raise train.rounds to train more rounds, or pass --fresh to start over",
        p.out_dir, snap.round, cfg.train.rounds, snap.step,
        !snap.replicas.empty() && snap.replicas[0].steps_in_round != 0
            ? fmt::format(", {} steps into round {}, which is past the end", snap.replicas[0].steps_in_round,
                          snap.round + 1)
            : std::string());
  }
  // The others' final evaluation is made again when result.json does not describe the checkpoint
  // (training.cpp).
  if (cfg.diloco.outer == config::outer_policy_kind::async &&
      !fs::exists(fs::path(p.out_dir) / "result.json"))
    spdlog::warn(
        "{} has no result.json (the run ended before writing it); `longwave eval {}` gives the final "
        "validation loss",
        p.out_dir, p.ckpt_dir);
}

}  // namespace

run_paths resolve_paths(const config::train_config& cfg) {
  run_paths p;
  p.out_dir = cfg.run.out_dir;
  p.data_dir = cfg.data.cache_dir.empty() ? (fs::path(p.out_dir) / "data").string() : cfg.data.cache_dir;
  p.ckpt_dir =
      cfg.checkpoint.dir.empty() ? (fs::path(p.out_dir) / "checkpoints").string() : cfg.checkpoint.dir;
  p.trace = (fs::path(p.out_dir) / "loss_trace.tsv").string();
  p.config_copy = (fs::path(p.out_dir) / "config.toml").string();
  return p;
}

void check_run_files(const run_paths& p) {
  const fs::path out(p.out_dir);
  for (const auto& f :
       {fs::path(p.trace), out / "metrics.jsonl", out / "result.json", fs::path(p.config_copy)}) {
    std::error_code ec;
    const auto type = fs::status(f, ec).type();  // through a link: the file it names
    // These would block the open for good, or fail it. A directory is said where the file is opened
    // (training goes on without it); a device (/dev/null, /dev/full) takes the writes.
    if (type != fs::file_type::fifo && type != fs::file_type::socket) continue;
    const char* what = type == fs::file_type::fifo ? "a FIFO (named pipe)" : "a socket";
    throw config::config_error("run.out_dir", fmt::format("{} is {}, not a file: the run writes this file "
                                                          "there; move it away or choose another run.out_dir",
                                                          f.string(), what));
  }
}

start_point find_start(const config::train_config& cfg, const run_options& opts, const run_paths& p,
                       const snapshot_shape& shape) {
  start_point start;
  const bool strays = report_stray_files(checkpoint_store(p.ckpt_dir, cfg.checkpoint.keep));
  if (opts.fresh) {  // says what it removes: the old run's files, this one writes its own
    std::error_code ec;
    std::vector<std::string> removed;
    size_t checkpoints = 0;
    for (const auto& f : checkpoint_store(p.ckpt_dir, cfg.checkpoint.keep).list())
      checkpoints += fs::remove(f, ec) ? 1 : 0;
    if (checkpoints > 0)
      removed.push_back(
          fmt::format("{} checkpoint{} in {}", checkpoints, checkpoints == 1 ? "" : "s", p.ckpt_dir));
    const auto out = fs::path(p.out_dir);
    for (const auto& f : {fs::path(p.trace), out / "result.json", out / "metrics.jsonl"})
      if (fs::remove(f, ec)) removed.push_back(f.filename().string());
    if (!removed.empty()) spdlog::info("--fresh: removed {}", fmt::join(removed, ", "));
    return start;
  }
  checkpoint_store store(p.ckpt_dir, cfg.checkpoint.keep);
  const auto not_this_run = [&](const std::string& what) {
    return lw_error(errc::checkpoint_mismatch,
                    fmt::format("{} (start over with --fresh, which removes every checkpoint in {}, "
                                "or use another out_dir)",
                                what, p.ckpt_dir));
  };
  std::optional<checkpoint> latest;
  // A cluster node's checkpoint: its hello announced that round, so a file it cannot use stops it.
  const auto take = [&](checkpoint& c) {
    start.resumed_from = c.source;
    if (auto why = shape_problem(c, shape); !why.empty()) throw not_this_run(why);
    try {
      start.resume = from_checkpoint(std::move(c), shape);
    } catch (const lw_error& e) {
      if (e.code() != errc::corrupt_checkpoint) throw;
      throw lw_error(errc::corrupt_checkpoint,
                     fmt::format("{}: {}; move that file aside (the node then offers the round before)",
                                 start.resumed_from, e.what()));
    }
  };
  const auto warn = [&](const std::string& w) {
    spdlog::warn("{}", w);
    ++start.corrupt_checkpoints;
  };
  if (opts.cluster_node) {
    // Its hello announced this round (or version): an older one would not be what the cluster counts on.
    std::vector<std::string> corrupt;
    latest = opts.max_resume_round
                 ? load_at_most(store, *opts.max_resume_round, &start.corrupt_checkpoints, &corrupt)
                 : store.load_latest(warn, {}, &corrupt);
    set_aside_corrupt(store, corrupt);
    if (latest) take(*latest);
    if (opts.max_resume_round)
      set_aside_from(store, *opts.max_resume_round + 1,
                     fmt::format("the cluster resumes after round {}; those rounds are not its history",
                                 *opts.max_resume_round));
  } else {
    // A newest file whose checksum holds but whose contents no run writes is skipped as a corrupt one is; one
    // written by a run of another shape is not (its older neighbours share the shape).
    struct shape_differs {
      std::string what;
    };
    const auto accept = [&](checkpoint& c) {
      if (auto why = shape_problem(c, shape); !why.empty()) throw shape_differs{c.source + ": " + why};
      start.resumed_from = c.source;
      start.resume = from_checkpoint(std::move(c), shape);
    };
    std::vector<std::string> corrupt;
    try {
      latest = store.load_latest(warn, accept, &corrupt);
    } catch (const shape_differs& e) {
      // A file copied in from another run is named, so that it can be moved aside instead.
      const auto files = store.list().size();
      throw not_this_run(files > 1
                             ? e.what + fmt::format("; {} other checkpoint file{} there: if only this file "
                                                    "is another run's, move it aside to resume from the "
                                                    "newest of the rest",
                                                    files - 1, files == 2 ? " is" : "s are")
                             : e.what);
    }
    set_aside_corrupt(store, corrupt);
  }
  // checkpoint.dir moved away from a run's checkpoints in out_dir: starting over would replace its trace, its
  // result.json and its sessions' story in metrics.jsonl (a probe), so only --fresh does.
  const auto by_default = fs::path(p.out_dir) / "checkpoints";
  std::error_code same_ec;
  // A store makes its directory: only one that is there is looked into.
  if (!latest && !cfg.checkpoint.dir.empty() && fs::is_directory(by_default, same_ec) &&
      !fs::equivalent(by_default, p.ckpt_dir, same_ec))
    if (const auto there = checkpoint_store(by_default.string(), cfg.checkpoint.keep).list(); !there.empty())
      throw config::config_error(
          "checkpoint.dir",
          fmt::format(
              "checkpoint.dir = \"{}\" holds no checkpoint, but {} holds {} of this out_dir's run (newest "
              "{}): set checkpoint.dir to it to resume, or pass --fresh to start a new run in {}",
              p.ckpt_dir, by_default.string(), there.size(), fs::path(there.back()).filename().string(),
              p.out_dir));
  if (!latest && strays) spdlog::info("no checkpoint to resume from in {}: starting a fresh run", p.ckpt_dir);
  if (start.resume && shape.data != 0) {
    const auto meta = parse_meta(start.resume->meta);
    if (const auto it = meta.find("data"); it != meta.end() && it->second != std::to_string(shape.data))
      spdlog::warn(
          "data: the training data ({}) differs from what the checkpoint's run read (the corpus was "
          "edited, truncated or replaced): the run goes on with it, so it is no longer an exact resume",
          cfg.data.path.empty() ? std::string("the default corpus") : cfg.data.path);
  }
  if (start.resume)
    if (const auto moved = split_change(start.resume->meta, shape); !moved.empty()) spdlog::warn("{}", moved);
  if (!start.resume || !run_complete(*start.resume, cfg)) {
    if (start.resume) warn_changed_settings(cfg, *start.resume);
    return start;
  }
  if (opts.cluster_node && cfg.diloco.outer == config::outer_policy_kind::async) {
    // The cluster resumes at its nodes' newest version, which this node may alone hold: it hands it on when
    // the nodes adopt the newest, then ends (async_policy).
    spdlog::info(
        "async: this node's checkpoint holds version {}, the run's last: it hands it to the "
        "cluster's nodes, then ends",
        start.resume->version);
    return start;
  }
  start.complete = true;
  report_complete(cfg, p, *start.resume);
  return start;
}

namespace {

/// A fetched state carries one member's worker state: every local worker starts from a copy of it.
void copy_donor_replica(train_snapshot& snap, int64_t n_replicas) {
  LW_ASSERT(!snap.replicas.empty(), "a fetched state carries one replica");
  const auto donor = std::move(snap.replicas[0]);
  snap.replicas.clear();
  for (int64_t r = 0; r < n_replicas; ++r) {
    replica_state rep = donor;
    rep.rank = r;
    rep.master = donor.master.clone();
    rep.exp_avg = donor.exp_avg.clone();
    rep.exp_avg_sq = donor.exp_avg_sq.clone();
    if (donor.outer_theta.defined()) rep.outer_theta = donor.outer_theta.clone();
    if (donor.outer_momentum.defined()) rep.outer_momentum = donor.outer_momentum.clone();
    if (donor.prev_delta.defined()) rep.prev_delta = donor.prev_delta.clone();
    snap.replicas.push_back(std::move(rep));
  }
}

}  // namespace

start_point joined_start(const config::train_config& cfg, const run_options& opts, const run_paths& p,
                         const snapshot_shape& shape, joined_state joined, const own_checkpoint& own) {
  start_point start;
  const bool versions = cfg.diloco.outer == config::outer_policy_kind::async;
  if (joined.fetched) {
    if (opts.fresh)
      (void)find_start(cfg, opts, p, shape);  // removes the old checkpoints and trace
    else  // a SIGKILL mid-write (the state this node fetched last time, say) left a .tmp
      (void)report_stray_files(checkpoint_store(p.ckpt_dir, cfg.checkpoint.keep));
    auto snap = std::move(*joined.fetched);
    // async: the state is named by its version (the donor's round field holds it); this node's rounds are
    // its own phases, and the join is one boundary after its own newest checkpoint (which would else outrank
    // the fetched state, holding an older version).
    if (versions) snap.round = own.round + 1;
    copy_donor_replica(snap, shape.n_replicas);
    // async: each worker's data position is its own (the donor's counts the donor's windows): a node that
    // rejoins reads on from its own checkpoint, rather than again the windows it trained, or past unread
    // ones.
    if (versions) {
      for (size_t r = 0; r < snap.replicas.size(); ++r)
        snap.replicas[r].sampler_position = r < own.sampler_positions.size() ? own.sampler_positions[r] : 0;
      spdlog::info("async: this node's workers read their own data on from position {} ({})",
                   snap.replicas.empty() ? 0 : snap.replicas[0].sampler_position,
                   own.sampler_positions.empty() ? "no checkpoint of its own" : "its newest checkpoint's");
      // Its inner steps count on from its own too; Adam's count stays the donor's, with its moments
      // (coordinator_state::step_offset).
      snap.step = own.step;
    }
    // The fetched state is this node's own checkpoint of its round before it trains: a crash of the whole
    // cluster soon after resumes with the same commands (else this node's newest checkpoint would be one the
    // members pruned long ago).
    snap.meta = std::string(config_marker) + config::to_toml(cfg);
    checkpoint_store store(p.ckpt_dir, cfg.checkpoint.keep);
    if (!versions)
      set_aside_from(store, snap.round,
                     "this node starts from the state it fetched; they are not of the cluster's history");
    const auto path = store.write(to_checkpoint(snap, shape));
    if (versions)
      spdlog::info("the fetched state of version {} is this node's checkpoint {} (its round {})",
                   snap.version, path, snap.round);
    else
      spdlog::info("the fetched state of round {} is this node's checkpoint {}", snap.round, path);
    start.resume = std::move(snap);
    start.resumed_from = path;
  } else {
    run_options own = opts;
    own.fresh = false;
    own.max_resume_round = joined.round;
    start = find_start(cfg, own, p, shape);
    if (!start.resume || start.resume->round != joined.round)
      throw lw_error(errc::corrupt_checkpoint,
                     fmt::format("the checkpoint of round {} this node joins with cannot be loaded from {}",
                                 joined.round, p.ckpt_dir));
  }
  // The observed round's inner steps are skipped: the counters move on as if they had run (async: no round is
  // observed).
  if (versions) return start;
  for (auto& r : start.resume->replicas) {
    r.adam_steps += cfg.train.inner_steps;
    r.sampler_position += static_cast<uint64_t>(cfg.train.inner_steps);
    r.steps_in_round = 0;
  }
  return start;
}

bool reset_run_files(const config::train_config& cfg, const run_paths& p, const start_point& start,
                     const std::string& config_file) {
  // A fresh start empties it (what fails there is said when the session opens it).
  bool trace = true;
  if (start.resume)
    trace = truncate_trace(p.trace, start.resume->step);
  else
    std::ofstream(p.trace, std::ios::trunc);
  // The copy never replaces a file it did not write: the config this run read may sit there.
  std::error_code ec;
  const bool is_input = !config_file.empty() && fs::equivalent(config_file, p.config_copy, ec);
  const bool resolved = resolved_copy(p.config_copy);
  if (is_input && resolved) {  // a run's copy run again: it may hold other settings than this run's
    spdlog::info(
        "{} is the config file this run reads: left as it is (the checkpoints hold this run's "
        "resolved config)",
        p.config_copy);
    return trace;
  }
  if (is_input || (fs::exists(p.config_copy, ec) && !resolved)) {
    spdlog::warn(
        "{} is {}, not a resolved copy a run wrote: left as it is (the checkpoints hold the resolved "
        "config)",
        p.config_copy, is_input ? "the config file this run reads" : "a file of yours");
    return trace;
  }
  if (const auto why = write_atomically(p.config_copy, config::to_toml(cfg)); !why.empty())
    spdlog::warn("the resolved config copy is not written: {}", why);
  return trace;
}

std::string write_result_file(const config::train_config& cfg, const run_result& r) {
  runtime::json_pretty j;
  j.add("mode", config::to_string(cfg.run.mode))
      .add("workers", cfg.train.workers)
      .add("rounds", static_cast<int64_t>(r.rounds))
      .add("inner_steps", cfg.train.inner_steps)
      .add("inner_steps_per_worker", r.steps)
      .add("val_loss", r.val_loss)  // JSON has no NaN: a loss that is not finite is null
      .add("val_ppl", std::exp(r.val_loss))
      .add("tokens", r.tokens)
      .add("seconds", std::round(r.seconds * 1e3) / 1e3)  // milliseconds
      .add("train_seconds", std::round(r.train_seconds * 1e3) / 1e3);
  return runtime::write_atomically(cfg.run.out_dir + "/result.json", j.str() + "\n");
}

bool result_describes(const std::string& out_dir, const train_snapshot& snap) {
  std::ifstream in(fs::path(out_dir) / "result.json", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  rapidjson::Document doc;
  if (text.empty() || runtime::parse_json(text, doc) || !doc.IsObject()) return false;
  const auto* rounds = runtime::find_member(doc, "rounds");
  const auto* steps = runtime::find_member(doc, "inner_steps_per_worker");
  return rounds && steps && rounds->IsUint64() && steps->IsInt64() && rounds->GetUint64() == snap.round &&
         steps->GetInt64() == static_cast<int64_t>(snap.step);
}

int64_t planned_last_step(const config::train_config& cfg, const train_snapshot& snap) {
  const int64_t h = cfg.train.inner_steps, step = static_cast<int64_t>(snap.step);
  const int64_t in_round = snap.replicas.empty() ? 0 : snap.replicas[0].steps_in_round;
  int64_t left = static_cast<int64_t>(cfg.train.rounds) - static_cast<int64_t>(snap.round);
  if (left <= 0) return step;
  if (in_round == 0) return step + left * h;
  return step + std::max<int64_t>(0, h - in_round) + (left - 1) * h;  // the round under way, then the rest
}

void plan_resumed_run(run_context& ctx, const train_snapshot& snap) {
  const auto& cfg = ctx.cfg;
  // Their schedules follow round × H positions of their own (models::schedule_step), not these steps.
  if (cfg.diloco.outer == config::outer_policy_kind::async || cfg.federated.clients_per_round > 0 ||
      cfg.diloco.adaptive_steps)
    return;
  const int64_t planned = planned_last_step(cfg, snap);
  if (planned == ctx.planned_steps) return;
  spdlog::info(
      "the run ends at inner step {} (not train.rounds × train.inner_steps = {}: the checkpoint's {} steps "
      "were taken at another H); the learning-rate schedule spans {} steps",
      planned, ctx.planned_steps, snap.step, planned);
  ctx.planned_steps = planned;
  ctx.inner.total_steps = planned;
}

}  // namespace longwave::actors
