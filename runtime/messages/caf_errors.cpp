// errc <-> caf::error.
#include "runtime/messages/caf_errors.hpp"

#include "runtime/messages/type_ids.hpp"

namespace longwave::runtime {

caf::error make_error(errc code, const std::string& context) {
  return caf::make_error(code, context);
}

std::string describe(const caf::error& e) {
  if (e.category() == caf::atom("longwave")) {
    std::string out = to_string(static_cast<errc>(e.code()));
    const auto& ctx = e.context();
    if (!ctx.empty() && ctx.match_element<std::string>(0)) out += ": " + ctx.get_as<std::string>(0);
    return out;
  }
  return caf::to_string(e);
}

}  // namespace longwave::runtime
