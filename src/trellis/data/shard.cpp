#include "trellis/data/shard.h"

#include <bit>
#include <cstring>
#include <limits>

#include "trellis/core/error.h"
#include "trellis/io/atomic_file.h"

namespace trellis {

// The format is little-endian on disk (llm.c writes it with numpy on x86); we memcpy, so refuse
// to build where that would silently byte-swap.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes little-endian");

namespace {
constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);
}

std::vector<uint16_t> read_shard(const std::string& path) {
  const std::string bytes = read_file(path);
  TRELLIS_REQUIRE(bytes.size() >= kHeaderBytes,
                  "{}: truncated: {} bytes, shorter than the {}-byte shard header", path,
                  bytes.size(), kHeaderBytes);
  int32_t header[kShardHeaderInts];
  std::memcpy(header, bytes.data(), kHeaderBytes);
  TRELLIS_REQUIRE(header[0] == kShardMagic, "{}: bad magic {} (expected {}): not a token shard",
                  path, header[0], kShardMagic);
  TRELLIS_REQUIRE(header[1] == kShardVersion, "{}: unsupported shard version {} (expected {})",
                  path, header[1], kShardVersion);
  TRELLIS_REQUIRE(header[2] >= 0, "{}: header says {} tokens", path, header[2]);
  const size_t count = static_cast<size_t>(header[2]);
  const size_t payload = bytes.size() - kHeaderBytes;
  TRELLIS_REQUIRE(payload >= 2 * count, "{}: truncated: header says {} tokens, file holds {}{}",
                  path, count, payload / 2, payload % 2 ? " and a stray byte" : "");
  TRELLIS_REQUIRE(payload == 2 * count,
                  "{}: header says {} tokens, but the file has {} extra bytes after them", path,
                  count, payload - 2 * count);
  std::vector<uint16_t> tokens(count);
  if (count > 0) std::memcpy(tokens.data(), bytes.data() + kHeaderBytes, 2 * count);
  return tokens;
}

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  TRELLIS_REQUIRE(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                  "{}: {} tokens do not fit one shard (the header count is int32)", path,
                  tokens.size());
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(kHeaderBytes + 2 * tokens.size(), '\0');
  std::memcpy(bytes.data(), header, kHeaderBytes);
  if (!tokens.empty()) std::memcpy(bytes.data() + kHeaderBytes, tokens.data(), 2 * tokens.size());
  write_file_atomic(path, bytes);
}

}  // namespace trellis
