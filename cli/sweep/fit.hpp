#pragma once
// The scaling-law fit of `longwave sweep`: L(x) = A * x^-alpha + E by least squares, x a model size N (or
// tokens D), as in the DiLoCo scaling-law study (Charles et al. 2025).
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace longwave::cli::sweep {

/// A fitted power law with an offset and how well it fits.
struct power_law {
  bool ok = false;
  std::string problem;  ///< why there is no fit (when !ok)
  double a = std::numeric_limits<double>::quiet_NaN();
  double alpha = std::numeric_limits<double>::quiet_NaN();
  double e = std::numeric_limits<double>::quiet_NaN();
  /// Standard errors from the covariance s^2 (J^T J)^-1; NaN with no more points than parameters (3).
  double a_err = std::numeric_limits<double>::quiet_NaN();
  double alpha_err = std::numeric_limits<double>::quiet_NaN();
  double e_err = std::numeric_limits<double>::quiet_NaN();
  double rms = std::numeric_limits<double>::quiet_NaN();  ///< root mean square residual, in loss units
  size_t n = 0;                                           ///< points used
  size_t n_distinct = 0;                                  ///< distinct x among them

  /// The fitted curve at x.
  double at(double x) const;
};

/// Fits y = a * x^-alpha + e with E >= 0 (a loss floor) to the points with finite y and x > 0. Refused
/// (ok = false, problem says why, calling the x values `what`) with fewer than 3 distinct x, and not ok when
/// the loss does not fall with x (alpha or A <= 0: the law is for losses that do). Method: for a fixed e the
/// model is linear in log space (log(y - e) = log a - alpha log x), so a 1-D search over e in [0, min y) with
/// that regression gives a start that needs no guess; Levenberg-Marquardt on all three then minimises the
/// squared residuals of y itself. x is scaled by its geometric mean inside, so sizes of 1e9 condition as well
/// as 1e3.
power_law fit_power_law(const std::vector<double>& x, const std::vector<double>& y,
                        const std::string& what = "sizes");

}  // namespace longwave::cli::sweep
