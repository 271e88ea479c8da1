#pragma once
// Token shards in llm.c's format: 256 int32 header (magic 20240520, version 1, token count, rest
// zero), then `count` uint16 tokens.
#include <cstdint>
#include <string>
#include <vector>

namespace trellis {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderInts = 256;

// Reads and validates a shard (magic, version, size == header + 2*count); any problem is an input
// error naming the file.
std::vector<uint16_t> read_shard(const std::string& path);
// Writes atomically (temp file + rename). Tokens must be < 65536.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace trellis
