#pragma once
// Document indexes: where documents start inside a token shard, in a file beside it
// (train_000000.bin -> train_000000.idx), written by `trellis prepare` and read by
// --document-mask. Little-endian:
//   header int32[8]: [0] = 20240521 (magic), [1] = 1 (version), [2] = the shard's token count,
//                    [3] = n, the number of starts; the rest zero
//   then n uint32: the offsets in the shard where a document starts, strictly increasing, each
//                    below the token count.
// A shard that begins inside a document (one continued from the previous shard) has no start at
// 0. The index is mapped like its shard: opening it reads the header, and lookups read only the
// entries near the window asked for (they are checked there, not scanned whole at startup).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/mapped_file.h"

namespace trellis {

constexpr int32_t kDocIndexMagic = 20240521;
constexpr int32_t kDocIndexVersion = 1;
constexpr size_t kDocIndexHeaderInts = 8;

// The index beside a shard: NAME.bin -> NAME.idx.
std::string doc_index_path(const std::string& shard_path);

class DocIndex {
 public:
  // Maps and validates the index file: magic, version, its token count == shard_tokens (the
  // shard it describes), size == header + n entries. Any problem is an input error naming it.
  DocIndex(const std::string& path, int64_t shard_tokens);
  // Starts held in memory (the built-in corpus), named `name` in messages.
  DocIndex(std::vector<uint32_t> starts, int64_t tokens, std::string name);

  int64_t size() const { return n_; }
  const std::string& name() const { return name_; }
  // Appends the starts s with lo <= s < hi, in order (shard offsets). An entry out of order or
  // beyond the shard is an input error naming the file.
  void starts_in(int64_t lo, int64_t hi, std::vector<int64_t>& out) const;

 private:
  uint32_t at(int64_t i) const;
  std::string name_;
  MappedFile file_;
  std::vector<uint32_t> owned_;
  const uint8_t* data_ = nullptr;  // the first entry
  int64_t n_ = 0, tokens_ = 0;
};

// Writes atomically (temp file + rename); starts must be strictly increasing and below tokens.
void write_doc_index(const std::string& path, std::span<const uint32_t> starts, int64_t tokens);

}  // namespace trellis
