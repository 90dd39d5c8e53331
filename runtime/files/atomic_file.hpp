#pragma once
// One small file written whole or not at all: result.json, a sweep's tables, a report page.

#include <string>
#include <string_view>

namespace longwave::runtime {

/// Writes `text` to `path` through `path.tmp` (flushed to disk, then renamed over `path`), so a reader sees
/// the old file or the new one, never half of one, and a full disk leaves no empty file. Returns "" or one
/// line naming the file and the reason; the temporary file is removed on failure.
std::string write_atomically(const std::string& path, std::string_view text);

}  // namespace longwave::runtime
