#pragma once
// How messages about TOML files name the type of a value ("an integer", "a table"); the config loader's and
// the sweep file's.
#include <toml++/toml.h>

#include <string>

namespace longwave::config {

/// "a string", "an integer", "a float", "a boolean", "an array", "a table", "a date", ...
std::string toml_type_name(toml::node_type t);

}  // namespace longwave::config
