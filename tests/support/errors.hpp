#pragma once
// What a call throws, for tests: the lw_error's code and its message (one helper for every test).
#include <string>

#include "runtime/errors/errors.hpp"

namespace longwave::test {

/// The code of the lw_error that fn throws, errc::none when it throws none; with `message`, its text too.
/// Any other exception passes through (and fails the test).
template <class Fn>
errc error_of(Fn&& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const lw_error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return errc::none;
}

}  // namespace longwave::test
