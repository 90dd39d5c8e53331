#pragma once
// A pretty-printed (two-space indent) flat JSON object for files that people read too: a run's result.json,
// an export's config.json. Strings, integers, doubles (non-finite ones become null), booleans, null and
// arrays of strings, through RapidJSON's writer.
#include <rapidjson/prettywriter.h>
#include <rapidjson/stringbuffer.h>

#include <cmath>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace longwave::runtime {

class json_pretty {
 public:
  json_pretty() : w_(text_) {
    w_.SetIndent(' ', 2);
    w_.StartObject();
  }
  json_pretty(const json_pretty&) = delete;
  json_pretty& operator=(const json_pretty&) = delete;

  json_pretty& add(std::string_view key, std::string_view v) {
    key_(key);
    string_(v);
    return *this;
  }
  json_pretty& add(std::string_view key, const char* v) { return add(key, std::string_view(v)); }
  json_pretty& add(std::string_view key, const std::string& v) { return add(key, std::string_view(v)); }
  json_pretty& add(std::string_view key, bool v) {
    key_(key);
    w_.Bool(v);
    return *this;
  }
  json_pretty& add(std::string_view key, double v) {
    key_(key);
    if (std::isfinite(v))
      w_.Double(v);
    else
      w_.Null();
    return *this;
  }
  template <class Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
  json_pretty& add(std::string_view key, Int v) {
    key_(key);
    if constexpr (std::is_signed_v<Int>)
      w_.Int64(static_cast<int64_t>(v));
    else
      w_.Uint64(static_cast<uint64_t>(v));
    return *this;
  }
  json_pretty& add(std::string_view key, const std::vector<std::string>& v) {
    key_(key);
    w_.StartArray();
    for (const auto& s : v) string_(s);
    w_.EndArray();
    return *this;
  }
  json_pretty& add_null(std::string_view key) {
    key_(key);
    w_.Null();
    return *this;
  }

  /// The object, without a trailing newline. Nothing may be added after this.
  std::string str() {
    if (!w_.IsComplete()) w_.EndObject();
    return std::string(text_.GetString(), text_.GetSize());
  }

 private:
  void key_(std::string_view key) { w_.Key(key.data(), static_cast<rapidjson::SizeType>(key.size())); }
  void string_(std::string_view s) { w_.String(s.data(), static_cast<rapidjson::SizeType>(s.size())); }

  rapidjson::StringBuffer text_;
  rapidjson::PrettyWriter<rapidjson::StringBuffer> w_;
};

}  // namespace longwave::runtime
