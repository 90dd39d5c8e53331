// TOML config loader: fills train_config from TOML text and --set overrides, validates it, and writes it back
// as TOML. One table of fields (for_each_field, config/schema.hpp) drives parsing, validation and
// serialisation.
#include "config/config_loader.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <type_traits>
#include <utility>

#include "config/inert_settings.hpp"
#include "config/model_shape.hpp"
#include "config/schema.hpp"
#include "config/toml_types.hpp"

#if !TOML_EXCEPTIONS
#error "config_loader expects toml++ with exceptions enabled (toml::parse throws toml::parse_error)"
#endif

namespace longwave::config {

namespace {

constexpr int64_t int64_max = std::numeric_limits<int64_t>::max();
constexpr double inf = std::numeric_limits<double>::infinity();
// The byte tokenizer's vocabulary: model.vocab_size may not be smaller.
constexpr int64_t byte_vocab = 256;

std::string dotted(std::string_view section, std::string_view name) {
  return fmt::format("{}.{}", section, name);
}

/// Every dotted key, in struct order.
const std::vector<std::string>& all_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    train_config c;
    for_each_field(
        c, [&](std::string_view s, std::string_view n, auto&, const rule&) { out.push_back(dotted(s, n)); });
    return out;
  }();
  return keys;
}

/// Every section name, in struct order.
const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    train_config c;
    for_each_field(c, [&](std::string_view s, std::string_view, auto&, const rule&) {
      if (out.empty() || out.back() != s) out.emplace_back(s);
    });
    return out;
  }();
  return names;
}

bool is_section(std::string_view s) {
  const auto& names = section_names();
  return std::find(names.begin(), names.end(), s) != names.end();
}

/// Optimal string alignment distance (insert, delete, substitute, swap neighbours). Distances above 2 are
/// never used, so they all come back as 3.
size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size();
  const size_t m = b.size();
  if ((n > m ? n - m : m - n) > 2) return 3;
  std::vector<size_t> d((n + 1) * (m + 1));
  auto at = [&](size_t i, size_t j) -> size_t& { return d[i * (m + 1) + j]; };
  for (size_t i = 0; i <= n; ++i) at(i, 0) = i;
  for (size_t j = 0; j <= m; ++j) at(0, j) = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
      }
    }
  }
  return std::min<size_t>(at(n, m), 3);
}

/// " (did you mean 'x'?)" for the closest option within edit distance 2, else "".
std::string closest(std::string_view wrong, const std::vector<std::string>& options) {
  size_t best = 3;
  const std::string* pick = nullptr;
  for (const auto& o : options) {
    const size_t dist = edit_distance(wrong, o);
    if (dist < best) {
      best = dist;
      pick = &o;
    }
  }
  return pick ? fmt::format(" (did you mean '{}'?)", *pick) : std::string();
}

/// Suggestion for an unknown dotted key: a near miss, else the same name in another section.
std::string suggest_key(std::string_view key) {
  std::string near = closest(key, all_keys());
  if (!near.empty()) return near;
  const auto dot = key.find('.');
  const std::string_view name = dot == std::string_view::npos ? key : key.substr(dot + 1);
  for (const auto& k : all_keys()) {
    if (std::string_view(k).substr(k.find('.') + 1) == name) return fmt::format(" (did you mean '{}'?)", k);
  }
  return {};
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

std::string shorten(std::string s, size_t max = 64) {
  if (s.size() > max) s = s.substr(0, max - 3) + "...";
  return s;
}

std::string trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(first, last - first + 1));
}

/// A TOML basic string: quoted, with quotes, backslashes and control characters escaped.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned>(c));
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

/// Shortest text that reads back as the same double, always recognisable as a TOML float.
std::string toml_double(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "3600" -> "3600.0"; inf and nan contain 'n'
  return s;
}

// How values appear in messages and in to_toml.
std::string show(int64_t v) {
  return fmt::format("{}", v);
}
std::string show(uint64_t v) {
  return fmt::format("{}", v);
}
std::string show(double v) {
  return fmt::format("{}", v);
}
std::string show(bool v) {
  return v ? "true" : "false";
}
std::string show(const std::string& v) {
  return shorten(quote(v));
}
template <class E, class = std::enable_if_t<is_config_enum_v<E>>>
std::string show(E v) {
  return quote(to_string(v));
}

std::string show(const toml::node& n) {
  if (const auto* s = n.as_string()) return show(s->get());
  if (const auto* d = n.as_floating_point()) {
    // As TOML wrote it: 2.0 is a float (it showed "train.rounds = 2: expected an integer, got a float").
    const double v = d->get();
    return std::isfinite(v) && v == std::trunc(v) && std::abs(v) < 1e15 ? fmt::format("{:.1f}", v) : show(v);
  }
  if (n.is_table()) return "{...}";
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return shorten(one_line(os.str()));
}

std::string toml_value(int64_t v) {
  return show(v);
}
std::string toml_value(uint64_t v) {
  return show(v);
}
std::string toml_value(double v) {
  return toml_double(v);
}
std::string toml_value(bool v) {
  return show(v);
}
std::string toml_value(const std::string& v) {
  return quote(v);
}
template <class E, class = std::enable_if_t<is_config_enum_v<E>>>
std::string toml_value(E v) {
  return quote(to_string(v));
}

template <class T>
std::string expected_name() {
  if constexpr (std::is_same_v<T, std::string> || is_config_enum_v<T>) {
    return "a string";
  } else if constexpr (std::is_same_v<T, bool>) {
    return "a boolean (true or false)";
  } else if constexpr (std::is_same_v<T, double>) {
    return "a number";
  } else {
    return "an integer";
  }
}

/// What the rule allows, e.g. "must be an integer >= 1", "allowed values are fp32, bf16".
template <class T>
std::string describe(const rule& r) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    return fmt::format("must be an integer in {}..{}", r.int_lo, r.int_hi);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    if (r.zero_ok) return fmt::format("must be 0 or an integer in {}..{}", r.int_lo, r.int_hi);
    if (r.int_hi == int64_max) return fmt::format("must be an integer >= {}", r.int_lo);
    return fmt::format("must be an integer in {}..{}", r.int_lo, r.int_hi);
  } else if constexpr (std::is_same_v<T, double>) {
    std::string s = "must be a finite number";
    if (r.lo > -inf) s += fmt::format(" {} {}", r.lo_open ? ">" : ">=", r.lo);
    if (r.hi < inf) s += fmt::format("{} {} {}", r.lo > -inf ? " and" : "", r.hi_open ? "<" : "<=", r.hi);
    return s;
  } else if constexpr (is_config_enum_v<T>) {
    return fmt::format("allowed values are {}", fmt::join(enum_names<T>::names, ", "));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!r.allowed.empty()) return fmt::format("allowed values are {}", fmt::join(r.allowed, ", "));
    if (r.non_empty) return "must not be empty";
    return "any string";
  } else {
    return "true or false";
  }
}

template <class T>
[[noreturn]] void fail_range(const std::string& key, const T& v, const rule& r,
                             const std::string& where = "") {
  throw config_error(key, fmt::format("{} = {}: {}{}", key, show(v), describe<T>(r), where));
}

template <class T>
[[noreturn]] void fail_type(const std::string& key, const toml::node& n, const std::string& where) {
  throw config_error(key, fmt::format("{} = {}: expected {}, got {}{}{}", key, show(n), expected_name<T>(),
                                      toml_type_name(n.type()),
                                      std::is_integral_v<T> ? integer_hint(n) : std::string(), where));
}

/// Stores a TOML value in a field after checking its type (not its range: that is validate's job).
void assign(int64_t& dst, const toml::node& n, const std::string& key, const std::string& where,
            const rule&) {
  const auto* v = n.as_integer();
  if (!v) fail_type<int64_t>(key, n, where);
  dst = v->get();
}

void assign(uint64_t& dst, const toml::node& n, const std::string& key, const std::string& where,
            const rule& r) {
  const auto* v = n.as_integer();
  if (!v) fail_type<uint64_t>(key, n, where);
  if (v->get() < 0) fail_range<int64_t>(key, v->get(), r, where);
  dst = static_cast<uint64_t>(v->get());
}

void assign(double& dst, const toml::node& n, const std::string& key, const std::string& where, const rule&) {
  if (const auto* f = n.as_floating_point()) {
    dst = f->get();
  } else if (const auto* i = n.as_integer()) {
    dst = static_cast<double>(i->get());
  } else {
    fail_type<double>(key, n, where);
  }
}

void assign(bool& dst, const toml::node& n, const std::string& key, const std::string& where, const rule&) {
  const auto* v = n.as_boolean();
  if (!v) fail_type<bool>(key, n, where);
  dst = v->get();
}

void assign(std::string& dst, const toml::node& n, const std::string& key, const std::string& where,
            const rule&) {
  const auto* v = n.as_string();
  if (!v) fail_type<std::string>(key, n, where);
  dst = v->get();
}

// Range checks, one per field type.
void check(const std::string& key, int64_t v, const rule& r) {
  if ((r.zero_ok && v == 0) || (v >= r.int_lo && v <= r.int_hi)) return;
  fail_range(key, v, r);
}

void check(const std::string& key, uint64_t v, const rule& r) {
  if (v >= static_cast<uint64_t>(r.int_lo) && v <= static_cast<uint64_t>(r.int_hi)) return;
  fail_range(key, v, r);
}

void check(const std::string& key, double v, const rule& r) {
  const bool above = r.lo_open ? v > r.lo : v >= r.lo;
  const bool below = r.hi_open ? v < r.hi : v <= r.hi;
  if (std::isfinite(v) && above && below) return;
  fail_range(key, v, r);
}

void check(const std::string&, bool, const rule&) {}

void check(const std::string& key, const std::string& v, const rule& r) {
  const bool listed =
      r.allowed.empty() || std::find(r.allowed.begin(), r.allowed.end(), v) != r.allowed.end();
  if (listed && !(r.non_empty && v.empty())) return;
  fail_range(key, v, r);
}

/// An enum field set from code (not the loader) may hold a number outside the enum.
template <class E, class = std::enable_if_t<is_config_enum_v<E>>>
void check(const std::string& key, E v, const rule& r) {
  if (static_cast<size_t>(v) < enum_names<E>::names.size()) return;
  fail_range(key, v, r);
}

/// The error for an enum field set to a text that names none of its values, e.g. `run.mode = "DiLoCo":
/// allowed values are diloco, single, ddp`.
template <class E>
[[noreturn]] void fail_name(const std::string& key, const std::string& name, const rule& r) {
  throw config_error(key, fmt::format("{} = {}: {}", key, show(name), describe<E>(r)));
}

/// Every field's rule in struct order, then the cross-field checks. `unknown_names` (dotted key -> text) are
/// the enum fields whose last given name is none of the enum's; each is reported at its field's turn, like
/// any other field's value that its rule refuses.
void validate_fields(const train_config& cfg, const std::map<std::string, std::string>& unknown_names,
                     bool check_paths = true);

/// A directory setting that names an existing file, or a path through one, could never be created: refuse it
/// now rather than when the run first writes there. A path that does not exist yet is fine.
/// A path with a line break or another control character: from a TOML file's escapes ("\n"), never meant, and
/// it would break the one-line records a run writes about its files (prepared.txt, logs).
void check_one_line(const std::string& key, const std::string& path, const char* what = "path") {
  if (const auto problem = one_line_problem(path, what); !problem.empty())
    throw config_error(key, key + ": " + problem);
}

void check_dir(const std::string& key, const std::string& dir) {
  if (dir.empty()) return;
  check_one_line(key, dir);
  // A name the filesystem refuses (255 bytes on Linux's; --dry-run passed it and the run failed making it).
  for (const auto& part : std::filesystem::path(dir))
    if (part.native().size() > 255)
      throw config_error(key, fmt::format("{} = {}: a name in it is {} bytes long; a file or directory name "
                                          "has at most 255",
                                          key, quote(dir), part.native().size()));
  std::error_code ec;
  for (std::filesystem::path p(dir); !p.empty(); p = p.parent_path()) {
    const auto st = std::filesystem::status(p, ec);
    if (std::filesystem::is_directory(st)) return;
    // Paths in full (show() would shorten them): the user needs to see which file is in the way.
    const std::string what = p == std::filesystem::path(dir) ? std::string("it") : quote(p.string());
    // Worded as runtime::make_directories says it at launch, which --dry-run did not reach.
    if (!std::filesystem::exists(st) && std::filesystem::is_symlink(std::filesystem::symlink_status(p, ec)))
      throw config_error(
          key, fmt::format("{} = {}: {}a symbolic link to {}, which does not exist; create its "
                           "target or choose another {}",
                           key, quote(dir), p == std::filesystem::path(dir) ? "" : p.string() + " is ",
                           std::filesystem::read_symlink(p, ec).string(), key));
    if (std::filesystem::exists(st)) {
      throw config_error(key, fmt::format("{} = {}: {} is a file, not a directory; choose another {}", key,
                                          quote(dir), what, key));
    }
    if (p == p.parent_path()) return;
  }
}

/// (key, node) pairs of a table in the order they appear in the source, so the first error reported is the
/// first one in the file.
std::vector<std::pair<std::string, const toml::node*>> in_source_order(const toml::table& t) {
  std::vector<std::pair<std::string, const toml::node*>> out;
  for (const auto& [k, n] : t) out.emplace_back(std::string(k.str()), &n);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const auto& x = a.second->source().begin;
    const auto& y = b.second->source().begin;
    return std::make_pair(x.line, x.column) < std::make_pair(y.line, y.column);
  });
  return out;
}

/// True if `raw` was meant as a number (so a TOML error about it is worth showing).
bool looks_numeric(std::string_view raw) {
  return !raw.empty() && std::string_view("0123456789+-.").find(raw.front()) != std::string_view::npos;
}

/// One parse: TOML text and overrides into a train_config, remembering where each key was set so that
/// validation errors can point there.
class loader {
 public:
  loader(std::string_view source_name, const std::vector<std::string>& foreign)
      : src_(source_name), foreign_(foreign) {}

  void apply_text(std::string_view text) {
    toml::table root;
    try {
      root = parse_toml(text, src_);
    } catch (const toml::parse_error& e) {
      const auto& b = e.source().begin;
      throw config_error("syntax", fmt::format("syntax error at {}: {}{}", position(b.line, b.column),
                                               e.description(), excerpt(text, b.line)));
    }
    for (const auto& [section, node] : in_source_order(root)) {
      const std::string where = at(*node);
      if (std::find(foreign_.begin(), foreign_.end(), section) != foreign_.end()) continue;
      if (!is_section(section)) {
        if (node->is_table()) {
          const bool cluster_file = section == "cluster" || section == "nodes" || section == "security";
          throw config_error(
              section,
              fmt::format("unknown section [{}]{}{}{}", section, closest(section, section_names()), where,
                          cluster_file ? " (a cluster file: run it with `longwave launch` "
                                         "or `longwave node`)"
                                       : ""));
        }
        throw config_error(section, fmt::format("unknown key '{}' outside any section{}{}", section,
                                                suggest_key(section), where));
      }
      const toml::table* table = node->as_table();
      if (!table) {
        throw config_error(section, fmt::format("{} = {}: expected a table [{}], got {}{}", section,
                                                show(*node), section, toml_type_name(node->type()), where));
      }
      for (const auto& [name, value] : in_source_order(*table)) set(section, name, *value, at(*value));
    }
  }

  void apply_override(const std::string& ov) {
    const auto eq = ov.find('=');
    const std::string key = override_key(ov);
    if (eq == std::string::npos) {
      throw config_error(key.empty() ? "override" : key,
                         fmt::format("override '{}' has no '=': write --set section.key=value, e.g. --set "
                                     "train.workers=2",
                                     shorten(ov)));
    }
    const std::string raw = trim(std::string_view(ov).substr(eq + 1));
    const auto dot = key.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == key.size()) {
      throw config_error(
          key.empty() ? "override" : key,
          fmt::format("override '{}': the key must be section.key, e.g. --set train.workers=2{}", shorten(ov),
                      key.empty() ? "" : suggest_key(key)));
    }
    const std::string section = key.substr(0, dot);
    const std::string name = key.substr(dot + 1);
    const std::string where = " (from --set)";
    if (raw.find_first_of("\r\n") != std::string::npos)  // a string field would take it as it is
      throw config_error(
          key, fmt::format("{}: the value contains a line break; --set takes one line{}", key, where));
    if (!is_utf8(raw))  // the run's config.toml, and its checkpoints', could not be read back
      throw config_error(
          key, fmt::format("{}: the value is not UTF-8 text, which a TOML config must be{}", key, where));

    // "v = <raw>" parses a lone TOML value; a line break could smuggle in more keys, so it is never parsed.
    std::optional<toml::table> parsed;
    std::string problem = "it contains a line break";
    if (raw.find_first_of("\r\n") == std::string::npos) {
      try {
        parsed = parse_toml("v = " + raw, "--set");
        if (parsed->size() != 1) {
          parsed.reset();
          problem = "it is more than one value";
        }
      } catch (const toml::parse_error& e) {
        problem = std::string(e.description());
      }
    }
    const toml::node* node = parsed ? parsed->get("v") : nullptr;

    bool found = false;
    for_each_field(cfg_, [&](std::string_view s, std::string_view n, auto& field, const rule& r) {
      if (found || s != section || n != name) return;
      found = true;
      using field_type = std::decay_t<decltype(field)>;
      if constexpr (std::is_same_v<field_type, std::string> || is_config_enum_v<field_type>) {
        // A string field takes the raw text unless it is a quoted TOML string: run.name=2024 is "2024".
        std::string text = node && node->is_string() ? node->as_string()->get() : raw;
        if constexpr (is_config_enum_v<field_type>) {
          assign_name(field, text, key);
        } else {
          field = std::move(text);
        }
      } else if (node) {
        assign(field, *node, key, where, r);
      } else if (looks_numeric(raw)) {
        throw config_error(
            key, fmt::format("{} = {}: not {}: {}; {}{}", key, shorten(raw), expected_name<field_type>(),
                             problem, describe<field_type>(r), where));
      } else {
        assign(field, toml::value<std::string>(raw), key, where, r);
      }
    });
    if (!found) throw config_error(key, fmt::format("unknown key '{}'{}{}", key, suggest_key(key), where));
    where_[key] = where;
  }

  /// validate(), with the place the bad key was set appended to the message.
  void validate_with_origin(bool check_paths) const {
    try {
      validate_fields(cfg_, unknown_names_, check_paths);
    } catch (const config_error& e) {
      const auto it = where_.find(e.key());
      if (it == where_.end()) throw;
      throw config_error(e.key(), e.message() + it->second);
    }
  }

  const train_config& cfg() const { return cfg_; }

 private:
  void set(const std::string& section, const std::string& name, const toml::node& value,
           const std::string& where) {
    const std::string key = dotted(section, name);
    bool found = false;
    for_each_field(cfg_, [&](std::string_view s, std::string_view n, auto& field, const rule& r) {
      if (found || s != section || n != name) return;
      found = true;
      using field_type = std::decay_t<decltype(field)>;
      if constexpr (is_config_enum_v<field_type>) {
        const auto* v = value.as_string();
        if (!v) fail_type<field_type>(key, value, where);
        assign_name(field, v->get(), key);
      } else {
        assign(field, value, key, where, r);
      }
    });
    if (!found) throw config_error(key, fmt::format("unknown key '{}'{}{}", key, suggest_key(key), where));
    where_[key] = where;
  }

  /// Stores an enum field from its TOML name. A name outside the enum is kept for validate_fields to report,
  /// as a string field's bad value is: a later line or --set may still correct it.
  template <class E>
  void assign_name(E& field, const std::string& name, const std::string& key) {
    if (const auto v = from_string<E>(name)) {
      field = *v;
      unknown_names_.erase(key);
    } else {
      unknown_names_[key] = name;
    }
  }

  std::string position(uint32_t line, uint32_t column) const {
    if (src_.empty()) return fmt::format("line {}:{}", line, column);
    return fmt::format("{}:{}:{}", src_, line, column);
  }

  std::string at(const toml::node& n) const {
    const auto& b = n.source().begin;
    if (b.line == 0) return {};
    return fmt::format(" (at {})", position(b.line, b.column));
  }

  /// " in `text of that line`", so the user sees what the parser choked on.
  static std::string excerpt(std::string_view text, uint32_t line) {
    size_t start = 0;
    for (uint32_t i = 1; i < line; ++i) {
      start = text.find('\n', start);
      if (start == std::string_view::npos) return {};
      ++start;
    }
    std::string l = trim(text.substr(start, text.find('\n', start) - start));
    // The line may hold the very bytes the parser rejected: keep the message printable ASCII.
    for (char& ch : l) {
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    }
    return l.empty() ? std::string() : fmt::format(" in `{}`", shorten(l, 80));
  }

  std::string src_;
  std::vector<std::string> foreign_;  // top-level keys another reader owns (e.g. [cluster], [[nodes]])
  train_config cfg_;
  std::map<std::string, std::string> where_;  // dotted key -> " (at file:line:col)" or " (from --set)"
  std::map<std::string, std::string> unknown_names_;  // enum key -> the last text given, if it names no value
};

}  // namespace

config_error::config_error(std::string key, const std::string& message)
    : std::runtime_error("config error: " + one_line(message)),
      key_(std::move(key)),
      message_(one_line(message)) {}

namespace {

/// diloco.adaptive_steps: the policies whose rounds have one all-reduce at the round's end. The nodes' step
/// times ride on each call's confirmation, on the ring or on an NCCL epoch alike.
void check_adaptive(const train_config& cfg) {
  const auto& d = cfg.diloco;
  if (d.min_steps > cfg.train.inner_steps)
    throw config_error("diloco.min_steps",
                       fmt::format("diloco.min_steps = {}: above train.inner_steps = {} (a node never runs "
                                   "more than H inner steps a round)",
                                   d.min_steps, cfg.train.inner_steps));
  if (!d.adaptive_steps) return;
  if (cfg.run.mode != run_mode::diloco || cfg.federated.clients_per_round > 0)
    throw config_error("diloco.adaptive_steps",
                       fmt::format("diloco.adaptive_steps = true: runs with run.mode = \"diloco\" without "
                                   "client sampling (this run: \"{}\", federated.clients_per_round = {})",
                                   to_string(cfg.run.mode), cfg.federated.clients_per_round));
  if (d.outer == outer_policy_kind::streaming)
    throw config_error("diloco.adaptive_steps",
                       "diloco.adaptive_steps = true: diloco.outer = \"streaming\" syncs its fragments at "
                       "fixed inner steps of the round; use \"sync\", \"delayed\" or \"eager\"");
}

/// diloco.outer = "async": one pseudo-gradient per node per contribution, merged by the master over the
/// ZeroMQ ring; [async]'s fields agree with each other. (That it runs in a cluster is checked at start.)
void check_async(const train_config& cfg) {
  const auto& a = cfg.async;
  if (a.grace_min_s > a.grace_max_s)
    throw config_error("async.grace_min_s",
                       fmt::format("async.grace_min_s = {}: above async.grace_max_s = {} (the grace window "
                                   "lasts from grace_min_s to grace_max_s)",
                                   a.grace_min_s, a.grace_max_s));
  if (cfg.diloco.outer != outer_policy_kind::async) return;
  const auto refuse = [&](const char* key, const std::string& why) {
    throw config_error(key, fmt::format("diloco.outer = \"async\": {}", why));
  };
  if (cfg.diloco.adaptive_steps)
    refuse(
        "diloco.adaptive_steps",
        "each node contributes when its own inner steps are done, so diloco.adaptive_steps does not apply; "
        "set it to false");
  if (cfg.comm.backend == comm_backend::nccl)
    refuse("comm.backend",
           "its merges are all-reduces among the members while others train, on the ZeroMQ ring; use "
           "comm.backend = \"ring\"");
  if (!cfg.outer.nesterov)
    refuse("outer.nesterov",
           "its outer step is Delayed Nesterov (async.dn_period); set outer.nesterov = true");
}

void validate_fields(const train_config& cfg, const std::map<std::string, std::string>& unknown_names,
                     bool check_paths) {
  for_each_field(cfg, [&](std::string_view s, std::string_view n, const auto& field, const rule& r) {
    const std::string key = dotted(s, n);
    using field_type = std::decay_t<decltype(field)>;
    if constexpr (is_config_enum_v<field_type>) {
      if (const auto it = unknown_names.find(key); it != unknown_names.end())
        fail_name<field_type>(key, it->second, r);
    }
    check(key, field, r);
  });

  {
    in_addr probe{};
    if (::inet_pton(AF_INET, cfg.metrics.address.c_str(), &probe) != 1)
      throw config_error("metrics.address",
                         fmt::format("metrics.address = \"{}\": not an IPv4 address; use e.g. \"127.0.0.1\" "
                                     "(this host only) or \"0.0.0.0\" (every interface)",
                                     cfg.metrics.address));
  }
  if (cfg.comm.backend == comm_backend::nccl && cfg.comm.dtype == wire_dtype::int8) {
    throw config_error("comm.dtype",
                       "comm.dtype = \"int8\": comm.backend = \"nccl\" reduces fp32, fp16 and bf16 only; use "
                       "comm.dtype = \"fp32\", \"fp16\" or \"bf16\", or comm.backend = \"ring\"");
  }
  if (cfg.comm.backend == comm_backend::nccl && cfg.comm.dtype == wire_dtype::sparse) {
    throw config_error("comm.dtype",
                       "comm.dtype = \"sparse\": its messages are all-gathered over the ZeroMQ ring; use "
                       "comm.backend = \"ring\"");
  }
  if (cfg.comm.dtype == wire_dtype::sparse && cfg.comm.robust_clip &&
      cfg.comm.sparse_indices == sparse_index_mode::shared) {
    throw config_error("comm.robust_clip",
                       "comm.robust_clip = true: shared indices are summed on the ring, there is no node's "
                       "message to clip; use comm.sparse_indices = \"topk\" or comm.robust_clip = false");
  }
  // Measured (bench/RESULTS.md, issue 22): with shared indices a value waits up to 1/density rounds, and a
  // slowly decaying residual then applies that many rounds' worth at once; at 0.95 the run diverges.
  if (cfg.comm.dtype == wire_dtype::sparse && cfg.comm.sparse_indices == sparse_index_mode::shared &&
      cfg.comm.ef_decay > 0.5) {
    throw config_error(
        "comm.ef_decay",
        fmt::format("comm.ef_decay = {}: with comm.sparse_indices = \"shared\" a decay above 0.5 "
                    "diverges (measured at 0.95); use comm.ef_decay = 0 to 0.5",
                    cfg.comm.ef_decay));
  }
  if (cfg.comm.dtype == wire_dtype::sparse && cfg.run.mode == run_mode::ddp) {
    throw config_error(
        "comm.dtype",
        "comm.dtype = \"sparse\" codes DiLoCo's pseudo-gradients with error feedback; run.mode = "
        "\"ddp\" averages gradients every step: use comm.dtype = \"fp32\" (or \"int8\") with ddp");
  }
  if (cfg.comm.value_bits == 3) {
    throw config_error("comm.value_bits",
                       "comm.value_bits = 3: the sparse codec sends 2 or 4 bits per value");
  }
  if (cfg.run.mode != run_mode::diloco && cfg.diloco.outer != outer_policy_kind::sync) {
    throw config_error(
        "diloco.outer",
        fmt::format("diloco.outer = \"{}\": outer-step policies apply to run.mode = \"diloco\", "
                    "this run is \"{}\"; use diloco.outer = \"sync\"",
                    to_string(cfg.diloco.outer), to_string(cfg.run.mode)));
  }
  if (cfg.diloco.outer == outer_policy_kind::streaming) {
    const auto& d = cfg.diloco;
    if (cfg.train.inner_steps % d.fragments != 0)
      throw config_error(
          "diloco.fragments",
          fmt::format("diloco.fragments = {}: train.inner_steps ({}) must be a multiple of it, "
                      "so that fragment f syncs at inner step f * H / P of each round",
                      d.fragments, cfg.train.inner_steps));
    if (d.tau >= cfg.train.inner_steps / d.fragments)
      throw config_error(
          "diloco.tau",
          fmt::format("diloco.tau = {}: must be below train.inner_steps / diloco.fragments = {} (only one "
                      "fragment may be in flight at a time)",
                      d.tau, cfg.train.inner_steps / d.fragments));
  }
  if (cfg.federated.clients_per_round > 0 &&
      (cfg.run.mode != run_mode::diloco || cfg.diloco.outer != outer_policy_kind::sync)) {
    throw config_error(
        "federated.clients_per_round",
        fmt::format("federated.clients_per_round = {}: client sampling runs with run.mode = \"diloco\" and "
                    "diloco.outer = \"sync\" (this run: \"{}\", \"{}\")",
                    cfg.federated.clients_per_round, to_string(cfg.run.mode), to_string(cfg.diloco.outer)));
  }
  if (const auto problem = device_problem(cfg.train.device); !problem.empty())
    throw config_error("train.device", fmt::format("train.device = \"{}\": {}", cfg.train.device, problem));
  if (cfg.train.batch_size % cfg.train.micro_batches != 0)
    throw config_error("train.micro_batches",
                       fmt::format("train.micro_batches = {}: must divide train.batch_size = {} (each inner "
                                   "step splits its batch into equal micro-batches)",
                                   cfg.train.micro_batches, cfg.train.batch_size));
  if (cfg.run.mode == run_mode::single && cfg.train.workers != 1) {
    throw config_error(
        "train.workers",
        fmt::format("train.workers = {}: run.mode = \"single\" trains one replica, so "
                    "train.workers must be 1 (use --set train.workers=1, or run.mode = \"diloco\")",
                    cfg.train.workers));
  }
  const bool bpe = cfg.data.tokenizer == tokenizer_kind::bpe;
  const int64_t tokens = bpe ? cfg.data.bpe_vocab_size : byte_vocab;
  // Ready shards bring their own vocabulary (data.tokenizer is not used): the run checks their ids. A stored
  // config (check_paths false) is not checked: its run took it, wherever its data.path now points.
  std::error_code shards_ec;
  const bool shards = !cfg.data.path.empty() && std::filesystem::is_directory(cfg.data.path, shards_ec);
  if (cfg.model.vocab_size != 0 && cfg.model.vocab_size < tokens && !shards && check_paths) {
    throw config_error(
        "model.vocab_size",
        fmt::format("model.vocab_size = {}: smaller than the {} tokenizer's {} tokens; use 0 to "
                    "take it from the tokenizer, or at least {}",
                    cfg.model.vocab_size, to_string(cfg.data.tokenizer), tokens, tokens));
  }
  check_shape(cfg.model);
  // Here, not when the model is built: a coordinator and a node's --dry-run refuse it too.
  if (const auto layers = resolved_shape(cfg.model).layers;
      cfg.run.mode == run_mode::diloco && cfg.diloco.outer == outer_policy_kind::streaming &&
      cfg.diloco.fragments > layers)
    throw config_error(
        "diloco.fragments",
        fmt::format("diloco.fragments = {}: the model has only {} layers to split into fragments ({})",
                    cfg.diloco.fragments, layers,
                    cfg.model.layers > 0 ? fmt::format("model.layers = {}", cfg.model.layers)
                                         : fmt::format("model.preset = \"{}\"", cfg.model.preset)));
  check_adaptive(cfg);
  check_async(cfg);
  if (cfg.train.rounds > int64_max / cfg.train.inner_steps) {
    // Named by the larger of the two: the one most likely set by mistake.
    const bool steps = cfg.train.inner_steps > cfg.train.rounds;
    throw config_error(steps ? "train.inner_steps" : "train.rounds",
                       fmt::format("{} = {}: train.rounds * train.inner_steps ({} * {}) does not fit in a "
                                   "64-bit integer",
                                   steps ? "train.inner_steps" : "train.rounds",
                                   steps ? cfg.train.inner_steps : cfg.train.rounds, cfg.train.rounds,
                                   cfg.train.inner_steps));
  }
  if (!check_paths) return;
  check_dir("run.out_dir", cfg.run.out_dir);
  // Unset, they are out_dir's subdirectories (actors::resolve_paths): a file there is in their way too.
  const auto beside_out = [&](const char* sub) {
    return (std::filesystem::path(cfg.run.out_dir) / sub).string();
  };
  check_dir("checkpoint.dir", cfg.checkpoint.dir.empty() ? beside_out("checkpoints") : cfg.checkpoint.dir);
  check_dir("data.cache_dir", cfg.data.cache_dir.empty() ? beside_out("data") : cfg.data.cache_dir);
  check_one_line("data.path", cfg.data.path);
  check_one_line("run.name", cfg.run.name, "name");  // it labels log lines, metrics and the report
}

}  // namespace

std::string one_line_problem(const std::string& path, const char* what) {
  const auto bad = std::find_if(path.begin(), path.end(),
                                [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  if (bad == path.end()) return "";
  return fmt::format("the {} contains {} (byte 0x{:02x} at {}); a {} is one line of printable characters",
                     what, *bad == '\n' ? "a line break" : "a control character",
                     static_cast<unsigned char>(*bad), bad - path.begin(), what);
}

std::string device_problem(const std::string& d) {
  if (d == "cpu" || d == "cuda" || d == "auto") return "";
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() <= 8 &&
      std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "";
  return "allowed values are cpu, cuda, cuda:N (a GPU index) and auto";
}

std::string integer_hint(const toml::node& n) {
  const auto* f = n.as_floating_point();
  if (!f || !std::isfinite(f->get()) || f->get() != std::trunc(f->get()) || std::abs(f->get()) >= 1e15)
    return {};
  return fmt::format(" (write {} without the decimal point)", static_cast<int64_t>(f->get()));
}

std::string toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "an unknown value";
}

void validate(const train_config& cfg) {
  validate_fields(cfg, {});
}

train_config parse_config(std::string_view toml_text, const std::vector<std::string>& overrides,
                          std::string_view source_name, const std::vector<std::string>& foreign_sections,
                          bool check_paths) {
  try {
    loader l(source_name, foreign_sections);
    l.apply_text(toml_text);
    for (const auto& ov : overrides) l.apply_override(ov);
    l.validate_with_origin(check_paths);
    return l.cfg();
  } catch (const config_error&) {
    throw;
  } catch (const std::exception& e) {
    // Nothing but config_error leaves this function (bad_alloc, a toml++ surprise, ...).
    throw config_error("internal", fmt::format("unexpected error while reading the config {}: {}",
                                               source_name, one_line(e.what())));
  } catch (...) {
    throw config_error("internal", fmt::format("unexpected error while reading the config {}", source_name));
  }
}

std::string read_config_text(const std::string& path) {
  std::string text;
  try {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      throw config_error("file", fmt::format("cannot read config file '{}': it is a directory", path));
    }
    // A device could be read forever (/dev/zero), and a pipe is read once, by the front binary, before
    // longwave-torch reads it again: a config is a regular file.
    if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
      throw config_error("file",
                         fmt::format("cannot read config file '{}': not a regular file (a device or a "
                                     "pipe); write the config to a file",
                                     path));
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      const int err = errno;
      throw config_error("file", fmt::format("cannot read config file '{}': {}", path,
                                             err ? std::generic_category().message(err) : "cannot open it"));
    }
    std::ostringstream buf;
    buf << in.rdbuf();
    if (in.bad()) throw config_error("file", fmt::format("cannot read config file '{}': read failed", path));
    text = buf.str();
  } catch (const config_error&) {
    throw;
  } catch (const std::exception& e) {
    throw config_error("file", fmt::format("cannot read config file '{}': {}", path, one_line(e.what())));
  }
  return text;
}

void check_one_process(const train_config& cfg) {
  if (cfg.federated.clients_per_round > cfg.train.workers)
    throw config_error(
        "federated.clients_per_round",
        fmt::format("federated.clients_per_round = {}: the run has {} clients (workers) to draw "
                    "from",
                    cfg.federated.clients_per_round, cfg.train.workers));
}

train_config load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* warnings) {
  const std::string text = read_config_text(path);
  train_config cfg = parse_config(text, overrides, path);
  check_one_process(cfg);
  // parse_config accepted the text, so it parses; no table and no key in it means nothing was set.
  if (warnings && parse_toml(text, path).empty()) {
    warnings->push_back(fmt::format("config {} is empty: every setting {}is its default", path,
                                    overrides.empty() ? "" : "but the --set overrides "));
  }
  // A run's resolved copy sets every key, the inert ones too: only the overrides are the user's choice.
  const bool resolved = text.rfind(resolved_config_header, 0) == 0;
  if (warnings)
    for (auto& line : inert_settings(cfg, keys_set(resolved ? std::string() : text, overrides)))
      warnings->push_back(std::move(line));
  if (cfg.run.name.empty()) cfg.run.name = run_name_of_file(path);
  return cfg;
}

std::string override_key(std::string_view override_text) {
  return trim(override_text.substr(0, override_text.find('=')));
}

std::string run_name_of_file(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  if (!is_utf8(stem))
    for (auto& c : stem)
      if (static_cast<unsigned char>(c) >= 0x80) c = '_';
  return stem;
}

std::string to_toml(const train_config& cfg) {
  std::string out(resolved_config_header);
  std::string_view section;
  for_each_field(cfg, [&](std::string_view s, std::string_view n, const auto& field, const rule&) {
    if (s != section) {
      out += fmt::format("\n[{}]\n", s);
      section = s;
    }
    out += fmt::format("{} = {}\n", n, toml_value(field));
  });
  return out;
}

}  // namespace longwave::config
