#pragma once
// Settings a user set that the run's other settings leave without effect (diloco.tau without the streaming
// policy, [async] keys without async outer steps): valid, but likely a mistake, so each is named.
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::config {

/// The dotted keys ("section.key") set in a TOML text and by --set overrides ("section.key=value").
std::set<std::string> keys_set(std::string_view toml_text, const std::vector<std::string>& overrides);

/// A key of `set` that cfg's other settings make inert, and the line that says so.
struct inert_setting {
  std::string key, line;
};
std::vector<inert_setting> inert_keys(const train_config& cfg, const std::set<std::string>& set);

/// One line for each key of `set` that cfg's other settings make inert, naming the setting that would use it.
std::vector<std::string> inert_settings(const train_config& cfg, const std::set<std::string>& set);

}  // namespace longwave::config
