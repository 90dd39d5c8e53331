#pragma once
// A one-line JSON object builder for the run's event log (metrics.jsonl): flat objects of strings, integers,
// finite doubles (non-finite ones become null) and booleans.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace longwave::runtime {

class json_line {
 public:
  /// Starts an object with "kind" and "ts" (unix seconds).
  explicit json_line(std::string_view kind) {
    add("kind", kind);
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    key_("ts");
    out_ += fmt::format("{:.3f}", std::chrono::duration<double>(now).count());  // millisecond resolution
  }

  json_line& add(std::string_view key, std::string_view v) {
    key_(key);
    quote_(v);
    return *this;
  }
  json_line& add(std::string_view key, const char* v) { return add(key, std::string_view(v)); }
  json_line& add(std::string_view key, const std::string& v) { return add(key, std::string_view(v)); }
  json_line& add(std::string_view key, bool v) {
    key_(key);
    out_ += v ? "true" : "false";
    return *this;
  }
  json_line& add(std::string_view key, double v) {
    key_(key);
    out_ += std::isfinite(v) ? fmt::format("{:.10g}", v) : "null";
    return *this;
  }
  template <class Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
  json_line& add(std::string_view key, Int v) {
    key_(key);
    out_ += std::to_string(v);
    return *this;
  }

  /// The object, without a trailing newline.
  std::string str() const { return out_ + "}"; }

 private:
  void key_(std::string_view key) {
    out_ += out_.size() > 1 ? "," : "";
    quote_(key);
    out_ += ':';
  }
  void quote_(std::string_view s) {
    out_ += '"';
    for (const char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\t': out_ += "\\t"; break;
        case '\r': out_ += "\\r"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20)
            out_ += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          else
            out_ += c;
      }
    }
    out_ += '"';
  }

  std::string out_ = "{";
};

}  // namespace longwave::runtime
