// `longwave`: the command line. It links no LibTorch and runs every command that needs no model; the
// others it hands to longwave-torch beside it (cli/commands.hpp says which and why).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "cli/commands.hpp"
#include "runtime/log/log.hpp"
#include "runtime/memory/allocator.hpp"
#include "runtime/process/open_files.hpp"
#include "runtime/process/std_streams.hpp"

using namespace longwave;
using namespace longwave::cli;

namespace {

/// Replaces this process with longwave-torch from this binary's directory, same arguments (so the same PID
/// for a parent that signals it). Returns 1 only when it cannot be started.
int exec_torch(int argc, char** argv) {
  const auto exe = (std::filesystem::path(self_exe(argv[0])).parent_path() / "longwave-torch").string();
  ::execv(exe.c_str(), argv);
  std::fprintf(stderr,
               "longwave: cannot start %s (%s), which runs `longwave %s`: build it beside this binary "
               "(cmake --build --preset release --target longwave builds both)\n",
               exe.c_str(), std::strerror(errno), argc > 1 ? argv[1] : "");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // --version names LibTorch's kernels and the GPUs: only longwave-torch can say.
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) return exec_torch(argc, argv);
  const int held = runtime::hold_standard_descriptors();
  runtime::raise_open_file_limit();
  runtime::keep_freed_buffers();
  runtime::init_logging();
  CLI::App app;
  cli_values v;
  const auto sub = add_commands(app, v, [] { return std::string(); });
  // Every command line is parsed here (a bad one fails at once); the commands that need a model go on.
  if (const auto rc = parse_command_line(app, argc, argv)) return runtime::checked_stdout(*rc);
  if (const auto rc = keep_stdout_for_product(sub)) return *rc;
  if (const auto rc = run_tool(sub, v, argv[0]))
    return sub.stdout_checked(v) ? runtime::checked_stdout(*rc) : *rc;
  // `run`'s config too: one that does not load fails here, as longwave-torch would fail it.
  if (sub.run->parsed() && !load_run_config(v, nullptr)) return 2;
  std::fflush(stdout);
  runtime::release_standard_descriptors(held);
  return exec_torch(argc, argv);
}
