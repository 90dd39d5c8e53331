// L(x) = A * x^-alpha + E: a 1-D search over E with log-linear regression for A and alpha, then
// Levenberg-Marquardt on all three.
#include "cli/sweep/fit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

namespace longwave::cli::sweep {

namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

struct sample {
  double x, y;  // x divided by the geometric mean of the xs
};

/// Parameters of the scaled model y = a * x^-alpha + e.
struct params {
  double a = 0, alpha = 0, e = 0;
};

double sse(const std::vector<sample>& s, const params& p) {
  double sum = 0;
  for (const auto& q : s) {
    const double r = p.a * std::pow(q.x, -p.alpha) + p.e - q.y;
    sum += r * r;
  }
  return sum;
}

/// For a fixed e: least squares of log(y - e) = log a - alpha log x.
params regress(const std::vector<sample>& s, double e) {
  double mx = 0, my = 0;
  for (const auto& q : s) mx += std::log(q.x), my += std::log(q.y - e);
  mx /= static_cast<double>(s.size()), my /= static_cast<double>(s.size());
  double sxx = 0, sxy = 0;
  for (const auto& q : s) {
    const double dx = std::log(q.x) - mx;
    sxx += dx * dx, sxy += dx * (std::log(q.y - e) - my);
  }
  const double slope = sxy / sxx;
  return {std::exp(my - slope * mx), -slope, e};
}

/// The e in [0, min y) whose regression fits y best: a grid, then golden-section search around its best.
params start_point(const std::vector<sample>& s) {
  double y_min = HUGE_VAL;
  for (const auto& q : s) y_min = std::min(y_min, q.y);
  const double hi = y_min * (1 - 1e-9);
  auto cost = [&](double e) { return sse(s, regress(s, e)); };
  constexpr int n_grid = 200;
  int best = 0;
  double best_cost = HUGE_VAL;
  for (int i = 0; i <= n_grid; ++i)
    if (const double c = cost(hi * i / n_grid); c < best_cost) best_cost = c, best = i;
  double lo = hi * std::max(0, best - 1) / n_grid, up = hi * std::min(n_grid, best + 1) / n_grid;
  const double g = (std::sqrt(5.0) - 1) / 2;
  for (int it = 0; it < 80 && up - lo > 1e-14 * std::max(1.0, hi); ++it) {
    const double m1 = up - g * (up - lo), m2 = lo + g * (up - lo);
    if (cost(m1) < cost(m2))
      up = m2;
    else
      lo = m1;
  }
  const double e = (lo + up) / 2;
  return cost(e) < best_cost ? regress(s, e) : regress(s, hi * best / n_grid);
}

using mat3 = std::array<std::array<double, 3>, 3>;
using vec3 = std::array<double, 3>;

/// Solves m x = b by Gaussian elimination with partial pivoting; false when m is singular.
bool solve3(mat3 m, vec3 b, vec3& x) {
  for (int c = 0; c < 3; ++c) {
    int piv = c;
    for (int r = c + 1; r < 3; ++r)
      if (std::abs(m[r][c]) > std::abs(m[piv][c])) piv = r;
    if (!(std::abs(m[piv][c]) > 0)) return false;
    std::swap(m[c], m[piv]), std::swap(b[c], b[piv]);
    for (int r = c + 1; r < 3; ++r) {
      const double f = m[r][c] / m[c][c];
      for (int k = c; k < 3; ++k) m[r][k] -= f * m[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int r = 2; r >= 0; --r) {
    double v = b[r];
    for (int k = r + 1; k < 3; ++k) v -= m[r][k] * x[k];
    x[r] = v / m[r][r];
  }
  return std::isfinite(x[0]) && std::isfinite(x[1]) && std::isfinite(x[2]);
}

/// J^T J and J^T r of the residuals f(x) - y at p.
void normal_equations(const std::vector<sample>& s, const params& p, mat3& jtj, vec3& jtr) {
  jtj = {};
  jtr = {};
  for (const auto& q : s) {
    const double xa = std::pow(q.x, -p.alpha);
    const vec3 j = {xa, -p.a * xa * std::log(q.x), 1.0};
    const double r = p.a * xa + p.e - q.y;
    for (int i = 0; i < 3; ++i) {
      jtr[i] += j[i] * r;
      for (int k = 0; k < 3; ++k) jtj[i][k] += j[i] * j[k];
    }
  }
}

/// Levenberg-Marquardt from p, keeping e >= 0.
params refine(const std::vector<sample>& s, params p) {
  double lambda = 1e-3, cost = sse(s, p);
  for (int it = 0; it < 200 && cost > 0; ++it) {
    mat3 jtj;
    vec3 jtr;
    normal_equations(s, p, jtj, jtr);
    bool improved = false;
    while (lambda < 1e12) {
      mat3 m = jtj;
      for (int i = 0; i < 3; ++i) m[i][i] += lambda * std::max(jtj[i][i], 1e-300);
      vec3 step{};
      if (!solve3(m, {-jtr[0], -jtr[1], -jtr[2]}, step)) {
        lambda *= 10;
        continue;
      }
      const params next{p.a + step[0], p.alpha + step[1], std::max(0.0, p.e + step[2])};
      const double c = sse(s, next);
      if (std::isfinite(c) && c < cost) {
        const double gain = (cost - c) / cost;
        p = next, cost = c, lambda = std::max(lambda / 10, 1e-12), improved = true;
        if (gain < 1e-15) return p;
        break;
      }
      lambda *= 10;
    }
    if (!improved) break;
  }
  return p;
}

/// Standard errors of (A, alpha, E) from s^2 (J^T J)^-1 at the scaled optimum; A = a * x_ref^alpha.
void standard_errors(const std::vector<sample>& s, const params& p, double x_ref, power_law& out) {
  if (s.size() <= 3) return;
  mat3 jtj;
  vec3 jtr;
  normal_equations(s, p, jtj, jtr);
  const double s2 = sse(s, p) / static_cast<double>(s.size() - 3);
  mat3 cov;
  for (int c = 0; c < 3; ++c) {
    vec3 unit{}, col{};
    unit[c] = 1;
    if (!solve3(jtj, unit, col)) return;
    for (int r = 0; r < 3; ++r) cov[r][c] = col[r] * s2;
  }
  const double scale = std::pow(x_ref, p.alpha), l = std::log(x_ref);
  const vec3 g = {scale, p.a * scale * l, 0.0};  // dA / d(a, alpha, e)
  double var_a = 0;
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k) var_a += g[i] * cov[i][k] * g[k];
  out.a_err = std::sqrt(std::max(0.0, var_a));
  out.alpha_err = std::sqrt(std::max(0.0, cov[1][1]));
  out.e_err = std::sqrt(std::max(0.0, cov[2][2]));
}

}  // namespace

double power_law::at(double x) const {
  return a * std::pow(x, -alpha) + e;
}

power_law fit_power_law(const std::vector<double>& x, const std::vector<double>& y, const std::string& what) {
  power_law out;
  std::vector<sample> s;
  std::set<double> distinct;
  double log_sum = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (std::isfinite(x[i]) && x[i] > 0 && std::isfinite(y[i])) {
      s.push_back({x[i], y[i]});
      distinct.insert(x[i]);
      log_sum += std::log(x[i]);
    }
  out.n = s.size();
  out.n_distinct = distinct.size();
  if (distinct.size() < 3) {
    out.problem = fmt::format("{} distinct {} with a finite loss; fitting A, alpha and E needs at least 3",
                              distinct.size(), what);
    return out;
  }
  for (const auto& q : s)
    if (q.y <= 0) {
      out.problem = "a loss <= 0: the power law with E >= 0 cannot fit it";
      return out;
    }
  const double x_ref = std::exp(log_sum / static_cast<double>(s.size()));
  for (auto& q : s) q.x /= x_ref;
  const params p = refine(s, start_point(s));
  out.a = p.a * std::pow(x_ref, p.alpha);
  out.alpha = p.alpha;
  out.e = p.e;
  out.rms = std::sqrt(sse(s, p) / static_cast<double>(s.size()));
  standard_errors(s, p, x_ref, out);
  out.ok = std::isfinite(out.a) && std::isfinite(out.alpha) && std::isfinite(out.e);
  if (!out.ok) {
    out.problem = "the fit did not converge to finite values";
  } else if (out.alpha <= 0 || out.a <= 0) {  // a loss that rises, or stays flat, with x: no scaling law
    out.ok = false;
    out.problem = fmt::format("the loss does not fall as the {} grow (A = {:.3g}, alpha = {:.3g})", what,
                              out.a + 0.0, out.alpha + 0.0);
  }
  return out;
}

}  // namespace longwave::cli::sweep
