// Reads a sweep file, expands [grid] x [[points]] x seeds into points, and checks each point's config with
// the config loader before anything runs.
#include "cli/sweep/sweep_file.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "config/config_loader.hpp"
#include "config/inert_settings.hpp"
#include "config/schema.hpp"
#include "config/toml_types.hpp"

namespace longwave::cli::sweep {

namespace {

namespace fs = std::filesystem;

/// A value of the sweep file with the entry that set it (for messages).
struct entry_value {
  std::string key;
  const toml::node* node = nullptr;
};

/// The leaves of a table as dotted keys, in file order: `[grid] "a.b" = ..`, `a.b = ..` and `[grid.a] b =`
/// all give "a.b".
void flatten(const toml::table& t, const std::string& prefix, std::vector<entry_value>& out) {
  for (const auto& [k, n] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = n.as_table())
      flatten(*sub, key, out);
    else
      out.push_back({key, &n});
  }
}

std::vector<entry_value> flat_in_file_order(const toml::table& t) {
  std::vector<entry_value> out;
  flatten(t, "", out);
  std::stable_sort(out.begin(), out.end(), [](const entry_value& a, const entry_value& b) {
    const auto& x = a.node->source().begin;
    const auto& y = b.node->source().begin;
    return std::make_pair(x.line, x.column) < std::make_pair(y.line, y.column);
  });
  return out;
}

/// A TOML basic string.
std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    else
      out += c;
  }
  return out + "\"";
}

/// A scalar TOML value as a setting (its --set text and its display text); nullopt for arrays, tables,
/// dates and times, which no config key takes.
std::optional<setting> to_setting(const std::string& key, const toml::node& n) {
  setting s{key, "", ""};
  if (const auto* v = n.as_string()) {
    s.value = toml_quote(v->get());
    s.text = v->get();
  } else if (const auto* i = n.as_integer()) {
    s.value = s.text = std::to_string(i->get());
  } else if (const auto* d = n.as_floating_point()) {
    s.text = fmt::format("{}", d->get());
    s.value = s.text.find_first_of(".eEn") == std::string::npos ? s.text + ".0" : s.text;
  } else if (const auto* b = n.as_boolean()) {
    s.value = s.text = b->get() ? "true" : "false";
  } else {
    return std::nullopt;
  }
  return s;
}

std::string type_of(const toml::node& n) {
  return config::toml_type_name(n.type());
}

/// 8 hex digits of FNV-1a: a short, stable tag for ids that must be told apart.
std::string hash8(std::string_view s) {
  uint32_t h = 2166136261u;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return fmt::format("{:08x}", h);
}

/// The text of a resolved config field, as a table shows it.
template <class T>
std::string field_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::string>)
    return v;
  else
    return fmt::format("{}", v);  // numbers; config enums print as their TOML names
}

/// The sweep file being read: where messages point.
struct reader {
  std::string path;
  std::string err(const std::string& entry, const std::string& what) const {
    return fmt::format("{}: {}: {}", path, entry, what);
  }
  [[noreturn]] void fail(const std::string& entry, const std::string& what) const {
    throw sweep_error(err(entry, what));
  }
};

/// Where a swept key came from, for messages: `grid "k"` or `[[points]] #2 "k"`.
struct origin {
  std::string key;
  std::string entry;
};

/// One [[points]] entry, flattened.
struct point_entry {
  std::string name;
  std::vector<setting> settings;
};

/// [sweep]
void read_sweep_table(const reader& r, const toml::table& t, sweep_spec& s, std::vector<uint64_t>& seeds) {
  bool has_repeats = false;
  for (const auto& e : flat_in_file_order(t)) {
    const auto& n = *e.node;
    const std::string entry = "sweep." + e.key;
    if (e.key == "base" || e.key == "out_dir") {
      const auto* v = n.as_string();
      if (!v || v->get().empty())
        r.fail(entry, v ? std::string("is empty: name a path")
                        : fmt::format("expected a non-empty path, got {}", type_of(n)));
      (e.key == "base" ? s.base : s.out_dir) = v->get();
    } else if (e.key == "repeats") {
      const auto* v = n.as_integer();
      if (!v || v->get() < 1 || v->get() > 10000)
        r.fail(entry, "must be an integer in 1..10000 (seeds run.seed + 0..repeats-1)");
      s.repeats = static_cast<size_t>(v->get());
      has_repeats = true;
    } else if (e.key == "seeds") {
      const auto* a = n.as_array();
      if (!a || a->empty()) r.fail(entry, "must be a non-empty list of integers >= 0, e.g. [1, 2, 3]");
      for (const auto& x : *a) {
        const auto* v = x.as_integer();
        if (!v || v->get() < 0) r.fail(entry, "must be a non-empty list of integers >= 0, e.g. [1, 2, 3]");
        if (std::count(seeds.begin(), seeds.end(), static_cast<uint64_t>(v->get())))
          r.fail(entry, fmt::format("seed {} is listed twice", v->get()));
        seeds.push_back(static_cast<uint64_t>(v->get()));
      }
    } else if (e.key == "parallel") {
      if (const auto* v = n.as_string(); v && v->get() == "auto")
        s.parallel = 0;
      else if (const auto* i = n.as_integer(); i && i->get() >= 1 && i->get() <= 1024)
        s.parallel = i->get();
      else
        r.fail(entry, "must be \"auto\" or an integer in 1..1024 (points run at once)");
    } else if (e.key == "set") {
      const auto* a = n.as_array();
      if (!a) r.fail(entry, "must be a list of \"section.key=value\" strings, like --set");
      for (const auto& x : *a) {
        const auto* v = x.as_string();
        if (!v) r.fail(entry, "must be a list of \"section.key=value\" strings, like --set");
        for (const auto& earlier : s.set)
          if (config::override_key(earlier) == config::override_key(v->get()))
            r.fail(entry, fmt::format("\"{}\" is set twice; give it once", config::override_key(earlier)));
        s.set.push_back(v->get());
      }
    } else {
      r.fail(entry, "unknown key; [sweep] takes base, out_dir, repeats, seeds, parallel and set");
    }
  }
  if (s.base.empty()) r.fail("sweep.base", "missing: name the config every point starts from");
  if (s.out_dir.empty()) r.fail("sweep.out_dir", "missing: name the directory for the sweep's runs");
  std::error_code ec;
  for (fs::path d(s.out_dir); !d.empty() && d != d.parent_path(); d = d.parent_path())
    if (const auto st = fs::status(d, ec); fs::exists(st) && !fs::is_directory(st))
      r.fail("sweep.out_dir",
             fmt::format("\"{}\": {} is a file, not a directory; choose another out_dir", s.out_dir,
                         d == fs::path(s.out_dir) ? "it" : "\"" + d.string() + "\""));
  // A directory no sweep used (it has no sweep.lock) is someone else's: the sweep's outputs would replace
  // theirs.
  if (!s.out_dir.empty() && fs::is_directory(s.out_dir, ec) &&
      !fs::exists(fs::path(s.out_dir) / "sweep.lock", ec))
    for (const char* f : {"results.csv", "results.jsonl", "fit.json", "sweep.html"})
      if (fs::is_regular_file(fs::path(s.out_dir) / f, ec)) {
        r.fail(
            "sweep.out_dir",
            fmt::format("\"{}\" holds a {} that no sweep wrote (the directory has no sweep.lock): the sweep "
                        "would overwrite it; choose another out_dir",
                        s.out_dir, f));
        break;
      }
  if (has_repeats && !seeds.empty()) r.fail("sweep.seeds", "give repeats or seeds, not both");
  if (!seeds.empty()) s.repeats = seeds.size();
  s.has_repeats = s.repeats > 1 || !seeds.empty();
}

/// A key that the sweep itself sets for every point cannot be swept.
void check_sweepable(const reader& r, const std::string& entry, const std::string& key, bool seeded) {
  if (key == "run.out_dir")
    r.fail(entry, "each point's run.out_dir is out_dir/points/<id>; set [sweep] out_dir instead");
  if (key == "checkpoint.dir")
    r.fail(entry, "each point keeps its checkpoints in out_dir/points/<id>/checkpoints; set [sweep] out_dir");
  if (key == "run.seed" && seeded)
    r.fail(entry, "repeats or seeds set run.seed; sweep seeds with [sweep] seeds = [...] instead");
  if (key == "name" || key == "seed") r.fail(entry, "\"name\" and \"seed\" are not config keys");
}

/// [grid]: key -> list of values, in file order.
std::vector<std::pair<std::string, std::vector<setting>>> read_grid(const reader& r, const toml::table& t,
                                                                    bool seeded) {
  std::vector<std::pair<std::string, std::vector<setting>>> grid;
  for (const auto& e : flat_in_file_order(t)) {
    const std::string entry = fmt::format("grid \"{}\"", e.key);
    check_sweepable(r, entry, e.key, seeded);
    for (const auto& g : grid)
      if (g.first == e.key)
        r.fail(entry, "given twice (a quoted and a dotted key, or a [grid.section]); give it once");
    const auto* a = e.node->as_array();
    if (!a) r.fail(entry, fmt::format("expected a list of values, e.g. [10, 20], got {}", type_of(*e.node)));
    if (a->empty()) r.fail(entry, "empty list: give at least one value");
    std::vector<setting> values;
    for (const auto& x : *a) {
      auto s = to_setting(e.key, x);
      if (!s)
        r.fail(entry,
               fmt::format("a value is {}; each value must be a string, number or boolean", type_of(x)));
      for (const auto& v : values)
        if (v.value == s->value) r.fail(entry, fmt::format("{} is listed twice", s->text));
      values.push_back(*s);
    }
    grid.emplace_back(e.key, std::move(values));
  }
  return grid;
}

/// "3 x 4 x 2": the grid's value counts, key by key ("1" without a grid).
std::string grid_sizes(const std::vector<std::pair<std::string, std::vector<setting>>>& grid) {
  std::string out;
  for (const auto& g : grid) out += (out.empty() ? "" : " x ") + std::to_string(g.second.size());
  return out.empty() ? "1" : out;
}

/// [[points]]
std::vector<point_entry> read_points(const reader& r, const toml::node& n, bool seeded) {
  const auto* a = n.as_array();
  if (!a || !a->is_array_of_tables())
    r.fail("points", "write each point as a [[points]] table of key = value (and optionally name = \"...\")");
  std::vector<point_entry> out;
  size_t i = 0;
  for (const auto& x : *a) {
    ++i;
    point_entry p;
    for (const auto& e : flat_in_file_order(*x.as_table())) {
      const std::string entry = fmt::format("[[points]] #{} \"{}\"", i, e.key);
      if (e.key == "name") {
        const auto* v = e.node->as_string();
        if (!v || v->get().empty()) r.fail(entry, "must be a non-empty string");
        p.name = v->get();
        continue;
      }
      check_sweepable(r, entry, e.key, seeded);
      for (const auto& st : p.settings)
        if (st.key == e.key) r.fail(entry, "given twice (a quoted and a dotted key); give it once");
      auto s = to_setting(e.key, *e.node);
      if (!s)
        r.fail(entry,
               fmt::format("got {}; a point's value must be a string, number or boolean", type_of(*e.node)));
      p.settings.push_back(*s);
    }
    if (i > 1 && p.name.empty() != out.front().name.empty())
      r.fail(fmt::format("[[points]] #{}", i), "name every point or none");
    for (size_t j = 0; j < out.size(); ++j)
      if (!p.name.empty() && out[j].name == p.name)
        r.fail(fmt::format("[[points]] #{}", i),
               fmt::format("name \"{}\" is also point #{}'s", p.name, j + 1));
    out.push_back(std::move(p));
  }
  return out;
}

/// [fit]
void read_fit(const reader& r, const toml::table& t, fit_spec& f) {
  f.enabled = true;
  bool has_group = false;
  for (const auto& e : flat_in_file_order(t)) {
    const std::string entry = "fit." + e.key;
    if (e.key == "size") {
      const auto* v = e.node->as_string();
      if (!v) r.fail(entry, "must be \"params\" or a swept numeric key such as \"model.dim\"");
      f.size = v->get();
    } else if (e.key == "group_by") {
      const auto* a = e.node->as_array();
      if (!a) r.fail(entry, "must be a list of swept keys, e.g. [\"run.mode\"]");
      for (const auto& x : *a) {
        const auto* v = x.as_string();
        if (!v) r.fail(entry, "must be a list of swept keys, e.g. [\"run.mode\"]");
        f.group_by.push_back(v->get());
      }
      has_group = true;
    } else if (e.key == "tokens") {
      const auto* v = e.node->as_boolean();
      if (!v) r.fail(entry, "must be true or false");
      f.tokens = v->get();
    } else {
      r.fail(entry, "unknown key; [fit] takes size, group_by and tokens");
    }
  }
  f.group_by_given = has_group;
}

/// The point's config: the base text with its overrides. A config error names the entry that set the key.
config::train_config build_config(const reader& r, const std::string& base_text, const sweep_spec& s,
                                  const std::vector<std::string>& overrides,
                                  const std::vector<origin>& origins, const std::string& point_label) {
  try {
    auto cfg = config::parse_config(base_text, overrides, s.base);
    config::check_one_process(cfg);
    return cfg;
  } catch (const config::config_error& e) {
    for (const auto& o : origins)
      if (o.key == e.key()) r.fail(o.entry, e.what());
    for (const auto& ov : s.set)
      if (config::override_key(ov) == e.key() || ov.find('=') == std::string::npos)
        r.fail(fmt::format("sweep.set \"{}\"", ov), e.what());
    // A point without settings of its own (no axis) is the base alone (it said "point : ...").
    const bool in_base =
        e.key() == "syntax" || e.key() == "file" || e.key() == "internal" || point_label.empty();
    r.fail(in_base ? fmt::format("sweep.base \"{}\"", s.base) : "point " + point_label, e.what());
  }
}

/// A folder name from a point's label: short keys, safe characters, a hash when long.
std::string make_id(const sweep_point& p, const sweep_spec& s) {
  std::map<std::string, int> short_uses;
  auto short_of = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  for (const auto& k : s.keys) ++short_uses[short_of(k)];
  std::vector<std::string> parts;
  if (!p.name.empty()) parts.push_back(p.name);
  for (const auto& st : p.settings)
    parts.push_back((short_uses[short_of(st.key)] > 1 ? st.key : short_of(st.key)) + "=" + st.text);
  if (s.has_repeats) parts.push_back(fmt::format("s{}", p.seed));
  std::string id;
  for (const auto& x : parts) id += (id.empty() ? "" : "_") + x;
  for (auto& c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view("._=+-").find(c) != std::string_view::npos))
      c = '_';
  if (id.empty()) id = "base";
  if (id[0] == '.' || id[0] == '-') id = "p" + id;
  if (id.size() > 80) id = id.substr(0, 70) + "-" + hash8(p.label(true));
  return id;
}

/// The resolved value of one config key, as text.
std::string config_value(const config::train_config& cfg, std::string_view key) {
  std::string out;
  config::for_each_field(
      cfg, [&](std::string_view sec, std::string_view name, const auto& field, const config::rule&) {
        if (key.size() == sec.size() + 1 + name.size() && key.substr(0, sec.size()) == sec &&
            key[sec.size()] == '.' && key.substr(sec.size() + 1) == name)
          out = field_text(field);
      });
  return out;
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end && *end == '\0';
}

/// [fit]'s keys against the expanded points; the default group_by is every swept key outside [model].
void check_fit(const reader& r, sweep_spec& s) {
  auto& f = s.fit;
  const bool swept = std::count(s.keys.begin(), s.keys.end(), f.size) > 0;
  if (f.size != "params") {
    if (!swept || f.size == "name")
      r.fail("fit.size",
             fmt::format("\"{}\" is not a swept key; use \"params\" (the parameter count) or one of "
                         "the swept keys",
                         f.size));
    for (const auto& p : s.points)
      if (!is_number(p.value_of(f.size)))
        r.fail("fit.size", fmt::format("\"{}\" = {} is not a number", f.size, p.value_of(f.size)));
  }
  if (!f.group_by_given) {
    for (const auto& k : s.keys)
      if (k != f.size && k.rfind("model.", 0) != 0) f.group_by.push_back(k);
  }
  for (const auto& g : f.group_by)
    if (!std::count(s.keys.begin(), s.keys.end(), g) || g == f.size)
      r.fail(fmt::format("fit.group_by \"{}\"", g),
             g == f.size ? "is the size key" : "is not a swept key (nor \"name\" of named points)");
  // Each group needs three sizes; known now when the size is a key or the parameter count is countable.
  if (f.size == "params" && !(s.points.empty() || s.points[0].params > 0)) return;
  std::map<std::string, std::set<double>> sizes;
  for (const auto& p : s.points) {
    std::string group;
    for (const auto& g : f.group_by) group += (group.empty() ? "" : " ") + g + "=" + p.value_of(g);
    sizes[group].insert(f.size == "params" ? p.params : std::strtod(p.value_of(f.size).c_str(), nullptr));
  }
  for (const auto& [group, xs] : sizes)
    if (xs.size() < 3)
      r.fail("fit", fmt::format("{}has {} distinct size{} ({}); fitting A, alpha and E needs at least 3",
                                group.empty() ? "" : "group " + group + " ", xs.size(),
                                xs.size() == 1 ? "" : "s", f.size));
}

}  // namespace

std::string sweep_point::label(bool with_seed) const {
  std::string out = name.empty() ? "" : "name=" + name;
  for (const auto& s : settings) out += (out.empty() ? "" : " ") + s.key + "=" + s.text;
  if (with_seed) out += fmt::format("{}seed={}", out.empty() ? "" : " ", seed);
  return out;
}

std::string sweep_point::value_of(std::string_view key) const {
  if (key == "name") return name;
  if (key == "seed") return std::to_string(seed);
  for (const auto& s : settings)
    if (s.key == key) return s.text;
  return config_value(cfg, key);
}

int64_t sweep_point::thread_need() const {
  return cfg.train.workers * std::max<int64_t>(1, cfg.train.threads);
}

sweep_spec parse_sweep(std::string_view text, const std::string& path, const param_counter& count) {
  const reader r{path};
  toml::table root;
  try {
    root = config::parse_toml(text, path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw sweep_error(fmt::format("{}:{}:{}: syntax error: {}", path, b.line, b.column, e.description()));
  }
  sweep_spec s;
  s.path = path;
  std::vector<uint64_t> seeds;
  const auto* sweep_table = root["sweep"].as_table();
  if (!sweep_table) r.fail("[sweep]", "missing: a sweep file needs [sweep] with base and out_dir");
  read_sweep_table(r, *sweep_table, s, seeds);
  const bool seeded = s.has_repeats;
  std::vector<std::pair<std::string, std::vector<setting>>> grid;
  std::vector<point_entry> entries;
  for (const auto& [k, n] : root) {
    const std::string key(k.str());
    if (key == "sweep") continue;
    if (key == "grid") {
      if (!n.is_table()) r.fail("grid", "must be a table: [grid] then \"section.key\" = [values]");
      grid = read_grid(r, *n.as_table(), seeded);
    } else if (key == "points") {
      entries = read_points(r, n, seeded);
    } else if (key == "fit") {
      if (!n.is_table()) r.fail("fit", "must be a table: [fit]");
      read_fit(r, *n.as_table(), s.fit);
    } else {
      r.fail(key, "unknown entry; a sweep file has [sweep], [grid], [[points]] and [fit]");
    }
  }
  for (const auto& [key, values] : grid)
    for (const auto& e : entries)
      for (const auto& st : e.settings)
        if (st.key == key)
          r.fail(fmt::format("grid \"{}\"", key), "also set in [[points]]; sweep a key in one place");
  for (const auto& ov : s.set) {
    const std::string key = config::override_key(ov);
    for (const auto& g : grid)
      if (g.first == key) r.fail(fmt::format("sweep.set \"{}\"", ov), "the key is also in [grid]");
    check_sweepable(r, fmt::format("sweep.set \"{}\"", ov), key, seeded);
  }

  // The base is relative to the sweep file.
  const fs::path base =
      fs::path(s.base).is_absolute() ? fs::path(s.base) : fs::path(path).parent_path() / s.base;
  s.base = base.lexically_normal().string();
  std::string base_text;
  try {
    base_text = config::read_config_text(s.base);
  } catch (const config::config_error& e) {
    r.fail("sweep.base", e.what());
  }
  std::vector<std::string> common = {"metrics.port=0"};  // points that run at once each pick a free port
  common.insert(common.end(), s.set.begin(), s.set.end());

  // The swept keys, then every combination.
  if (!entries.empty() && !entries.front().name.empty()) s.keys.push_back("name");
  for (const auto& e : entries)
    for (const auto& st : e.settings)
      if (!std::count(s.keys.begin(), s.keys.end(), st.key)) s.keys.push_back(st.key);
  for (const auto& g : grid) s.keys.push_back(g.first);
  if (entries.empty()) entries.push_back({});
  // Counted so that no product wraps: past the limit the count stops mattering.
  constexpr size_t max_points = 100000;
  size_t n_combos = 1;
  const auto too_many = [&] {
    r.fail("grid", fmt::format("more than {} points ({} [[points]] entries x {} repeats x the grid's {})",
                               max_points, entries.size(), s.repeats, grid_sizes(grid)));
  };
  for (const auto& g : grid)
    if (__builtin_mul_overflow(n_combos, g.second.size(), &n_combos) || n_combos > max_points) too_many();
  size_t n_points = 0;
  if (__builtin_mul_overflow(n_combos, entries.size() * s.repeats, &n_points) || n_points > max_points)
    too_many();

  std::map<std::string, size_t> seen;         // config -> point index
  std::map<std::string, size_t> inert_lines;  // a swept key that has no effect -> the points it is in
  for (size_t rep = 0; rep < s.repeats; ++rep)
    for (size_t e = 0; e < entries.size(); ++e)
      for (size_t c = 0; c < n_combos; ++c) {
        sweep_point p;
        p.index = s.points.size();
        p.name = entries[e].name;
        p.entry = e;
        p.repeat = rep;
        std::vector<origin> origins;
        for (const auto& st : entries[e].settings) {
          p.settings.push_back(st);
          origins.push_back({st.key, fmt::format("[[points]] #{} \"{}\"", e + 1, st.key)});
        }
        size_t rest = c;
        std::vector<setting> grid_values(grid.size());
        for (size_t g = grid.size(); g-- > 0;) {  // the first grid key varies slowest
          grid_values[g] = grid[g].second[rest % grid[g].second.size()];
          rest /= grid[g].second.size();
          origins.push_back({grid[g].first, fmt::format("grid \"{}\"", grid[g].first)});
        }
        p.settings.insert(p.settings.end(), grid_values.begin(), grid_values.end());
        std::vector<std::string> ov = common;
        for (const auto& st : p.settings) ov.push_back(st.key + "=" + st.value);
        const auto unseeded = build_config(r, base_text, s, ov, origins, p.label(false));
        p.seed = seeds.empty() ? unseeded.run.seed + rep : seeds[rep];
        p.id = make_id(p, s);
        p.out_dir = (fs::path(s.out_dir) / "points" / p.id).string();
        ov.push_back(fmt::format("run.seed={}", p.seed));
        ov.push_back("run.out_dir=" + toml_quote(p.out_dir));
        // A base config's checkpoint.dir would be shared by every point: each keeps its own.
        ov.push_back("checkpoint.dir=" + toml_quote(p.out_dir + "/checkpoints"));
        ov.insert(ov.begin() + 1, "run.name=" + toml_quote(p.id));  // [sweep] set may rename it
        p.cfg = build_config(r, base_text, s, ov, origins, p.label(true));
        p.overrides = std::move(ov);
        if (count) p.params = count(p.cfg);
        // Two points that train alike, whatever names them: the config but for its name and directories (a
        // key set to its base value in one point and left alone in another is the same setting), and without
        // the swept keys its other settings make inert (diloco.fragments under sync, outer.lr in ddp).
        std::set<std::string> swept;
        for (const auto& st : p.settings) swept.insert(st.key);
        const auto inert = config::inert_keys(p.cfg, swept);
        auto effective = p.cfg;
        std::string why;
        if (!inert.empty()) {
          std::vector<std::string> live;
          for (const auto& o : p.overrides)
            if (std::none_of(inert.begin(), inert.end(),
                             [&](const auto& i) { return i.key == config::override_key(o); }))
              live.push_back(o);
          try {  // a config that needs the key set (to turn off what the base turns on) stays as it is
            effective = config::parse_config(base_text, live, s.base);
          } catch (const config::config_error&) {
          }
          for (const auto& i : inert) ++inert_lines[i.line];
          why = ": " + inert.front().line;
        }
        if (auto [it, fresh] = seen.emplace(training_identity(effective, p.settings), p.index); !fresh)
          r.fail(fmt::format("point {} ({})", p.index + 1, p.label(true)),
                 fmt::format("the same settings as point {}{}; remove one", it->second + 1, why));
        s.points.push_back(std::move(p));
      }
  // Ids that came out the same (characters replaced) get their settings' hash.
  std::map<std::string, int> ids;
  for (const auto& p : s.points) ++ids[p.id];
  for (auto& p : s.points)
    if (ids[p.id] > 1) {
      const std::string old_id = p.id;
      p.id += "-" + hash8(p.label(true));
      p.out_dir = (fs::path(s.out_dir) / "points" / p.id).string();
      const std::string checkpoints = p.out_dir + "/checkpoints";
      for (auto& o : p.overrides) {
        if (o.rfind("run.out_dir=", 0) == 0) o = "run.out_dir=" + toml_quote(p.out_dir);
        if (o.rfind("checkpoint.dir=", 0) == 0) o = "checkpoint.dir=" + toml_quote(checkpoints);
        if (o.rfind("run.name=", 0) == 0) o = "run.name=" + toml_quote(p.id);
      }
      if (p.cfg.run.name == old_id) p.cfg.run.name = p.id;
      p.cfg.run.out_dir = p.out_dir;
      p.cfg.checkpoint.dir = checkpoints;
    }
  for (const auto& [line, n] : inert_lines)
    s.warnings.push_back(fmt::format("{} of the points: {}", n, line));
  if (s.fit.enabled) check_fit(r, s);
  return s;
}

std::string training_identity(const config::train_config& cfg, const std::vector<setting>& swept) {
  auto unnamed = cfg;
  unnamed.run.name = unnamed.run.out_dir = unnamed.checkpoint.dir = "";
  // How often the run saves, logs and waits, and where it serves metrics: the same losses either way, unless
  // the sweep varies it (its points differ in it: wall time, say).
  std::istringstream in(config::to_toml(unnamed));
  std::string out, section;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '[') section = line.substr(1, line.find(']') - 1);
    const auto key = section + "." + line.substr(0, line.find(' '));
    const bool no_loss = key == "checkpoint.every_rounds" || key == "checkpoint.keep" ||
                         key == "checkpoint.max_failed_writes" || section == "metrics" ||
                         section == "runtime" || key == "comm.timeout_s" || key == "comm.link_timeout_s";
    if (no_loss && line[0] != '[' &&
        std::none_of(swept.begin(), swept.end(), [&](const setting& st) { return st.key == key; }))
      continue;
    out += line + "\n";
  }
  return out;
}

std::string named_identity(const config::train_config& cfg) {
  auto unnamed = cfg;
  unnamed.run.name = unnamed.run.out_dir = unnamed.checkpoint.dir = "";
  return config::to_toml(unnamed);
}

sweep_spec load_sweep(const std::string& path, const param_counter& count) {
  std::string text;
  try {
    text = config::read_config_text(path);
  } catch (const config::config_error& e) {
    throw sweep_error(fmt::format("{}: cannot read the sweep file: {}", path, e.message()));
  }
  return parse_sweep(text, path, count);
}

}  // namespace longwave::cli::sweep
