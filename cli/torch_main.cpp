// longwave-torch: the commands that train or read a model's tensors (run, eval, export, sample, node) and
// --version, which `longwave` (cli/main.cpp) hands over by exec with the same arguments. It runs the other
// commands as well, so either binary alone answers every command line.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <vector>

#include "actors/collective_factory.hpp"
#include "actors/training.hpp"
#include "cli/commands.hpp"
#include "cli/export.hpp"
#include "cli/sample.hpp"
#include "cluster/roles.hpp"
#include "comm/frame.hpp"
#include "config/config_loader.hpp"
#include "longwave_version.hpp"
#include "models/cpu_kernels.hpp"
#include "models/gpu_info.hpp"
#include "runtime/log/log.hpp"
#include "runtime/memory/allocator.hpp"
#include "runtime/process/open_files.hpp"
#include "runtime/process/std_streams.hpp"
#include "runtime/process/stop_signals.hpp"

using namespace longwave;
using namespace longwave::cli;

namespace {

int cmd_run(const cli_values& v) {
  runtime::init_logging(v.log_level);
  std::vector<std::string> warnings;
  const auto cfg = load_run_config(v, &warnings);
  if (!cfg) return 2;
  for (const auto& w : warnings) spdlog::warn("{}", w);
  actors::run_options opts;
  opts.dry_run = v.run_dry_run;
  opts.fresh = v.run_fresh;
  opts.config_file = v.config_path;
  return runtime::end_with(actors::run_training(*cfg, opts));
}

/// `node`: joins the cluster as one node and trains (or, with --leave, asks the running node to leave).
int cmd_node(const cli_values& v) {
  runtime::init_logging(v.log_level);
  // Under `launch` every node reads the same file: the coordinator's warnings and a node's --dry-run say it.
  auto spec = load_cluster(v.cluster_path, v.cluster_overrides, /*warn=*/v.node_dry_run);
  if (!spec) return 2;
  actors::run_options nopts;
  nopts.fresh = v.cluster_fresh;
  nopts.config_file = v.cluster_path;
  nopts.dry_run = v.node_dry_run;
  nopts.leave = v.node_leave;
  nopts.endpoint = v.node_endpoint;
  nopts.workers = v.node_workers;
  return cluster::run_node_role(*spec, v.node_name, nopts);
}

}  // namespace

int main(int argc, char** argv) {
  runtime::hold_standard_descriptors();
  runtime::raise_open_file_limit();
  runtime::keep_freed_buffers();
  runtime::init_logging();
  CLI::App app;
  cli_values v;
  const auto sub = add_commands(app, v, [] {
    return std::string("longwave ") + LONGWAVE_COMMIT + " (wire protocol " +
           std::to_string(comm::protocol_version()) + ") on " + models::cpu_kernels() +
           "\ngpu: " + models::gpu_summary() + "; " + actors::nccl_summary();
  });
  if (const auto rc = parse_command_line(app, argc, argv)) return runtime::checked_stdout(*rc);
  if (const auto rc = keep_stdout_for_product(sub)) return *rc;
  if (const auto rc = run_tool(sub, v, argv[0]))
    return sub.stdout_checked(v) ? runtime::checked_stdout(*rc) : *rc;
  if (sub.run->parsed()) return sub.stdout_checked(v) ? runtime::checked_stdout(cmd_run(v)) : cmd_run(v);
  if (sub.node->parsed()) return sub.stdout_checked(v) ? runtime::checked_stdout(cmd_node(v)) : cmd_node(v);
  if (sub.eval->parsed()) return runtime::checked_stdout(actors::run_eval(v.ckpt, v.batches, v.eval_data));
  if (sub.exp->parsed()) return export_checkpoint(v.exp);
  if (sub.sample->parsed()) return runtime::checked_stdout(sample_checkpoint(v.sample));
  return 2;
}
