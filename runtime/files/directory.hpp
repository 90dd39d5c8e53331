#pragma once
// A directory made with its parents, or one line saying why it cannot be.

#include <string>

namespace longwave::runtime {

/// Creates `dir` and its parents (nothing if it is a directory already). Returns "" or why it cannot be made:
/// "a symbolic link to <target>, which does not exist", "<ancestor> is a file", or "cannot be created:
/// <system error>".
std::string make_directories(const std::string& dir);

}  // namespace longwave::runtime
