#pragma once
// Conversions between Longwave's errc/lw_error and caf::error, and one-line rendering.
#include <caf/error.hpp>

#include <string>

#include "runtime/errors/errors.hpp"

namespace longwave::runtime {

/// caf::error carrying errc and a context string.
caf::error make_error(errc code, const std::string& context);
/// "errc_name: context" for Longwave errors, CAF's own rendering otherwise.
std::string describe(const caf::error& e);

}  // namespace longwave::runtime
