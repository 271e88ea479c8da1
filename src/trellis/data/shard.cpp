#include "trellis/data/shard.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"

namespace trellis {

// The format is little-endian on disk (llm.c writes it with numpy on x86); we read it in place,
// so refuse to build where that would silently byte-swap.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes little-endian");

namespace {
constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);
}

int32_t shard_version_for_vocab(int64_t vocab) {
  TRELLIS_REQUIRE(vocab >= 1 && vocab <= (int64_t(1) << 32),
                  "a vocabulary of {} tokens does not fit a shard's token type (at most 2^32, "
                  "uint32)",
                  vocab);
  return vocab <= 65536 ? kShardVersion16 : kShardVersion32;
}

Shard::Shard(const std::string& path) : name_(path), file_(path) {
  const size_t bytes = file_.size();
  TRELLIS_REQUIRE(bytes >= kHeaderBytes,
                  "{}: truncated: {} bytes, shorter than the {}-byte shard header", path, bytes,
                  kHeaderBytes);
  int32_t header[kShardHeaderInts];
  std::memcpy(header, file_.data(), kHeaderBytes);
  TRELLIS_REQUIRE(header[0] == kShardMagic, "{}: bad magic {} (expected {}): not a token shard",
                  path, header[0], kShardMagic);
  TRELLIS_REQUIRE(header[1] == kShardVersion16 || header[1] == kShardVersion32,
                  "{}: unsupported shard version {} (expected {} for uint16 or {} for uint32 "
                  "tokens)",
                  path, header[1], kShardVersion16, kShardVersion32);
  version_ = header[1];
  width_ = version_ == kShardVersion16 ? 2 : 4;
  TRELLIS_REQUIRE(version_ == kShardVersion16 || header[3] == 4,
                  "{}: version 2 shard says {} bytes per token (expected 4)", path, header[3]);
  TRELLIS_REQUIRE(header[2] >= 0, "{}: header says {} tokens", path, header[2]);
  const size_t count = size_t(header[2]), w = size_t(width_);
  const size_t payload = bytes - kHeaderBytes;
  TRELLIS_REQUIRE(payload >= w * count, "{}: truncated: header says {} tokens, file holds {}{}",
                  path, count, payload / w, payload % w ? " and a stray byte" : "");
  TRELLIS_REQUIRE(payload == w * count,
                  "{}: header says {} tokens, but the file has {} extra bytes after them", path,
                  count, payload - w * count);
  count_ = int64_t(count);
  data_ = file_.data() + kHeaderBytes;
}

Shard::Shard(std::vector<uint32_t> tokens, std::string name)
    : name_(std::move(name)), owned_(std::move(tokens)) {
  data_ = reinterpret_cast<const uint8_t*>(owned_.data());
  count_ = int64_t(owned_.size());
}

void Shard::read(int64_t begin, int64_t n, uint32_t* out) const {
  TRELLIS_CHECK(begin >= 0 && n >= 0 && begin + n <= count_, "{}: tokens [{}, {}) of {}", name_,
                begin, begin + n, count_);
  // An empty read may come with out == nullptr (an empty vector's data()): memcpy must not see it
  // (UB even for 0 bytes; a find of fuzz/fuzz_shard on an empty version-2 shard).
  if (n == 0) return;
  if (width_ == 4) {
    std::memcpy(out, data_ + 4 * begin, size_t(n) * 4);
  } else {
    const auto* p = reinterpret_cast<const uint16_t*>(data_) + begin;
    std::copy_n(p, n, out);
  }
}

std::vector<uint32_t> read_shard(const std::string& path) {
  const Shard s(path);
  std::vector<uint32_t> out(size_t(s.size()));
  s.read(0, s.size(), out.data());
  return out;
}

void write_shard(const std::string& path, std::span<const uint32_t> tokens, int32_t version) {
  TRELLIS_CHECK(version == kShardVersion16 || version == kShardVersion32, "shard version {}",
                version);
  TRELLIS_REQUIRE(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                  "{}: {} tokens do not fit one shard (the header count is int32)", path,
                  tokens.size());
  const size_t w = version == kShardVersion16 ? 2 : 4;
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  if (version == kShardVersion32) header[3] = 4;
  std::string bytes(kHeaderBytes + w * tokens.size(), '\0');
  std::memcpy(bytes.data(), header, kHeaderBytes);
  if (version == kShardVersion32) {
    if (!tokens.empty()) std::memcpy(bytes.data() + kHeaderBytes, tokens.data(), 4 * tokens.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      TRELLIS_REQUIRE(tokens[i] <= 0xffff,
                      "{}: token {} does not fit a version-1 (uint16) shard; use version 2", path,
                      tokens[i]);
      const auto v = uint16_t(tokens[i]);
      std::memcpy(bytes.data() + kHeaderBytes + 2 * i, &v, 2);
    }
  }
  write_file_atomic(path, bytes);
}

}  // namespace trellis
