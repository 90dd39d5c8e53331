#pragma once
// Token shards in llm.c's .bin format: a header of 256 little-endian int32 (magic 20240520, version 1, token
// count), then the tokens as little-endian uint16.
#include <cstdint>
#include <string>
#include <vector>

namespace longwave::models::data {

/// header[0] of every shard.
constexpr int32_t shard_magic = 20240520;
/// header[1]: version 1 holds uint16 tokens.
constexpr int32_t shard_version = 1;
/// Bytes before the first token.
constexpr int64_t shard_header_bytes = 256 * 4;

/// Writes `tokens` to path + ".tmp", fsyncs and renames it to `path`. Throws lw_error(io_error).
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);

/// Reads and validates a shard: magic, version, and file length == 1024 + 2 * count exactly.
/// Throws lw_error(io_error) if unreadable and lw_error(corrupt_data) naming the file and the problem.
std::vector<uint16_t> read_shard(const std::string& path);

/// Every token id below `vocab` (the model's vocabulary: a larger one would index past its embedding).
/// Throws lw_error(corrupt_data) naming the file, the first such id and its position.
void check_token_ids(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& path);

/// Validates a shard's header and length as read_shard() does, without reading the tokens; returns the count.
int64_t read_shard_token_count(const std::string& path);

}  // namespace longwave::models::data
