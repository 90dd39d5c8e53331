#pragma once
// How messages about TOML files name the type of a value ("an integer", "a table"), and the one parse of
// TOML text; the config loader's, the cluster file's and the sweep file's.
#include <toml++/toml.h>

#include <string>
#include <string_view>

namespace longwave::config {

/// "a string", "an integer", "a float", "a boolean", "an array", "a table", "a date", ...
std::string toml_type_name(toml::node_type t);

/// For a float where an integer is expected: " (write 8 without the decimal point)" when `n` is a whole
/// number such as 8.0 (TOML reads it as a float), else "".
std::string integer_hint(const toml::node& n);

/// toml::parse, after refusing a key of more than 64 dotted parts (toml::parse_error at its line): toml++
/// makes a table per part and frees them recursively, so some 50,000 parts overflow the stack.
toml::table parse_toml(std::string_view text, std::string_view source = {});

/// Whether `text` is UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), which TOML text must
/// be: a value that is not could be set, but not written to a run's config.toml and read back.
bool is_utf8(std::string_view text);

}  // namespace longwave::config
