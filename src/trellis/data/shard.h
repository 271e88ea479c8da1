#pragma once
// Token shards: a 256-int32 little-endian header, then `count` tokens.
//   header[0] = 20240520 (magic), header[1] = version, header[2] = count, the rest zero.
//   version 1: uint16 tokens (llm.c's format; vocabularies of at most 65,536).
//   version 2: uint32 tokens (larger vocabularies, e.g. LLaMA-3's 128k); header[3] = 4, the
//              bytes per token, so a reader that knows only version 1 refuses it by the version.
// A Shard maps its file (core/mapped_file): opening one reads the header only, tokens are read
// where a window needs them.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/mapped_file.h"

namespace trellis {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion16 = 1;
constexpr int32_t kShardVersion32 = 2;
constexpr size_t kShardHeaderInts = 256;

// The version whose token type holds ids < vocab: 1 up to 65,536, 2 up to 2^32. A larger
// vocabulary is an input error.
int32_t shard_version_for_vocab(int64_t vocab);

class Shard {
 public:
  // Maps and validates a shard file (magic, version, size == header + count * token bytes); any
  // problem is an input error naming the file.
  explicit Shard(const std::string& path);
  // Tokens held in memory (the built-in corpus), named `name` in messages.
  Shard(std::vector<uint32_t> tokens, std::string name);

  int64_t size() const { return count_; }
  int32_t version() const { return version_; }
  const std::string& name() const { return name_; }
  uint32_t token(int64_t i) const {
    return width_ == 2 ? reinterpret_cast<const uint16_t*>(data_)[i]
                       : reinterpret_cast<const uint32_t*>(data_)[i];
  }
  // Tokens [begin, begin + n) into out (the range must lie inside the shard).
  void read(int64_t begin, int64_t n, uint32_t* out) const;
  // Unmaps the pages read so far from the resident set (a no-op for tokens in memory).
  void release_pages() const { file_.release_pages(); }

 private:
  std::string name_;
  MappedFile file_;
  std::vector<uint32_t> owned_;
  const uint8_t* data_ = nullptr;  // the first token
  int64_t count_ = 0;
  int32_t version_ = kShardVersion32;
  int width_ = 4;  // bytes per token
};

// Reads a whole shard into memory (tools and tests; training maps shards instead).
std::vector<uint32_t> read_shard(const std::string& path);
// Writes atomically (temp file + rename) in `version` (kShardVersion16 or kShardVersion32); a
// token the version cannot hold is an error.
void write_shard(const std::string& path, std::span<const uint32_t> tokens,
                 int32_t version = kShardVersion16);

}  // namespace trellis
