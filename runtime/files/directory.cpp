#include "runtime/files/directory.hpp"

#include <filesystem>
#include <system_error>

namespace fs = std::filesystem;

namespace longwave::runtime {

std::string make_directories(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) return {};
  std::error_code link_ec;
  if (fs::is_symlink(dir, link_ec) && !fs::exists(dir, link_ec))  // create_directories says "File exists"
    return "a symbolic link to " + fs::read_symlink(dir, link_ec).string() + ", which does not exist";
  return "cannot be created: " + ec.message();
}

}  // namespace longwave::runtime
