#pragma once
// Whole-file reads and crash-safe whole-file writes (temp file, fsync, rename) for the data pipeline.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace longwave::models::data {

/// Reads the whole file at `path`. `what` names the file's role in the error ("corpus", "token shard", ...).
/// Throws lw_error(io_error) naming the file and the OS error if it cannot be read. `each_chunk`, when given,
/// sees every piece read and the size the file reports (0: unknown), and may throw to stop early.
std::string read_file(const std::string& path, const char* what,
                      const std::function<void(std::string_view chunk, uint64_t size)>& each_chunk = {});

/// Writes the concatenation of `parts` to `path` + ".tmp", fsyncs it, renames it over `path` and fsyncs the
/// directory, so a reader sees either the old file or the complete new one. Throws lw_error(io_error).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts);

}  // namespace longwave::models::data
