#include "runtime/files/directory.hpp"

#include <filesystem>
#include <system_error>

namespace fs = std::filesystem;

namespace longwave::runtime {

std::string make_directories(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) return {};
  // create_directories says "File exists" for a dangling link or a file on the way: name that one.
  std::error_code e2;
  for (fs::path at = dir; !at.empty(); at = at.parent_path()) {
    const std::string which = at == fs::path(dir) ? "" : at.string() + " is ";
    if (fs::is_symlink(at, e2) && !fs::exists(at, e2))
      return which + "a symbolic link to " + fs::read_symlink(at, e2).string() + ", which does not exist";
    if (fs::exists(at, e2) && !fs::is_directory(at, e2)) return which + "a file, not a directory";
    if (at == at.parent_path()) break;
  }
  return "cannot be created: " + ec.message();
}

}  // namespace longwave::runtime
