// Groups a sweep's finished points by method and fits L(N) and L(D) to them.
#include "cli/sweep/scaling.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

namespace longwave::cli::sweep {

namespace {

std::string group_of(const sweep_spec& s, const sweep_point& p) {
  std::string g;
  for (const auto& k : s.fit.group_by) g += (g.empty() ? "" : " ") + k + "=" + p.value_of(k);
  return g;
}

double size_of(const sweep_spec& s, const sweep_point& p, const point_result& r) {
  if (s.fit.size == "params") return std::isfinite(r.params) ? r.params : p.params;
  return std::strtod(p.value_of(s.fit.size).c_str(), nullptr);
}

std::string with_error(double v, double err) {
  return std::isfinite(err) ? fmt::format("{:.4g} ± {:.2g}", v, err) : fmt::format("{:.4g}", v);
}

void number(rapidjson::Writer<rapidjson::StringBuffer>& w, const char* key, double v) {
  w.Key(key);
  if (std::isfinite(v))
    w.Double(v);
  else
    w.Null();
}

void text(rapidjson::Writer<rapidjson::StringBuffer>& w, const char* key, const std::string& v) {
  w.Key(key);
  w.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
}

void write_fits(rapidjson::Writer<rapidjson::StringBuffer>& w, const std::vector<group_fit>& fits) {
  w.StartArray();
  for (const auto& g : fits) {
    w.StartObject();
    text(w, "group", g.group);
    if (!g.size.empty()) text(w, "size", g.size);
    text(w, "x", g.x_name);
    w.Key("ok");
    w.Bool(g.fit.ok);
    if (!g.fit.ok) text(w, "problem", g.fit.problem);
    number(w, "A", g.fit.a);
    number(w, "alpha", g.fit.alpha);
    number(w, "E", g.fit.e);
    number(w, "A_err", g.fit.a_err);
    number(w, "alpha_err", g.fit.alpha_err);
    number(w, "E_err", g.fit.e_err);
    number(w, "rms_residual", g.fit.rms);
    w.Key("n");
    w.Uint64(g.fit.n);
    w.Key("data");
    w.StartArray();
    for (size_t i = 0; i < g.x.size(); ++i) {
      w.StartArray();
      w.Double(g.x[i]);
      w.Double(g.y[i]);
      w.EndArray();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
}

}  // namespace

scaling_fits fit_scaling(const sweep_spec& s, const std::vector<point_result>& results) {
  scaling_fits out;
  out.size_key = s.fit.size;
  if (!s.fit.enabled) return out;
  const std::string x_name = s.fit.size == "params" ? "N" : s.fit.size;
  std::map<std::string, group_fit> by_group;                    // in group order
  std::map<std::pair<std::string, double>, group_fit> by_size;  // (group, size)
  for (size_t i = 0; i < s.points.size() && i < results.size(); ++i) {
    const auto& r = results[i];
    if (r.status != "done" || !std::isfinite(r.val_loss)) continue;
    const auto group = group_of(s, s.points[i]);
    const double size = size_of(s, s.points[i], r);
    auto& g = by_group[group];
    g.group = group, g.x_name = x_name;
    g.x.push_back(size), g.y.push_back(r.val_loss);
    if (!s.fit.tokens) continue;
    auto& t = by_size[{group, size}];
    t.group = group, t.x_name = "D";
    t.size = fmt::format("{}={:.4g}", s.fit.size, size);
    for (const auto& [d, loss] : r.val_curve)
      if (d > 0 && std::isfinite(loss)) t.x.push_back(d), t.y.push_back(loss);
  }
  // Groups with no finished point still get a line saying so.
  for (const auto& p : s.points) {
    auto& g = by_group[group_of(s, p)];
    g.group = group_of(s, p), g.x_name = x_name;
  }
  for (auto& [k, g] : by_group) {
    g.fit = fit_power_law(g.x, g.y);
    out.sizes.push_back(std::move(g));
  }
  for (auto& [k, t] : by_size) {
    t.fit = fit_power_law(t.x, t.y, "token counts");
    out.tokens.push_back(std::move(t));
  }
  return out;
}

std::vector<std::string> fit_lines(const scaling_fits& f) {
  std::vector<std::string> out;
  auto line = [&](const group_fit& g) {
    std::string who = g.group;
    if (!g.size.empty()) who += (who.empty() ? "" : " ") + g.size;
    const std::string x = g.x_name == "D" ? "D" : "N";
    std::string law = fmt::format("L({0}) = A·{0}^-alpha + E", x);
    if (x == "N" && g.x_name != "N") law += " with N = " + g.x_name;
    const std::string head = (who.empty() ? "fit: " : "fit " + who + ": ") + law;
    if (!g.fit.ok) {
      out.push_back(head + ": not fitted: " + g.fit.problem);
      return;
    }
    out.push_back(fmt::format("{}, A={}, alpha={}, E={} (rms residual {:.3g}, {} points, {} distinct {})",
                              head, with_error(g.fit.a, g.fit.a_err),
                              with_error(g.fit.alpha, g.fit.alpha_err), with_error(g.fit.e, g.fit.e_err),
                              g.fit.rms, g.fit.n, g.fit.n_distinct, x == "D" ? "token counts" : "sizes"));
  };
  for (const auto& g : f.sizes) line(g);
  for (const auto& g : f.tokens) line(g);
  return out;
}

std::string fits_json(const scaling_fits& f) {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  text(w, "model", "L = A * x^-alpha + E");
  text(w, "size", f.size_key);
  w.Key("sizes");
  write_fits(w, f.sizes);
  w.Key("tokens");
  write_fits(w, f.tokens);
  w.EndObject();
  return std::string(buf.GetString()) + "\n";
}

}  // namespace longwave::cli::sweep
