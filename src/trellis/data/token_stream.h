#pragma once
// One split of a corpus (train or val): its shards read as one concatenated stream of tokens.
// The shards stay mapped (data/shard.h), so a stream of any length costs its headers to open and
// the pages of the windows read from it. Those pages count in the resident set, and the kernel
// maps file pages in large folios (up to 2 MB per fault), so after every kReleaseBytes of
// (pessimistically counted) faults the stream drops its mappings: a long run's resident set stays
// bounded however much of the corpus it has read.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trellis/data/doc_index.h"
#include "trellis/data/shard.h"

namespace trellis {

class TokenStream {
 public:
  static constexpr int64_t kReleaseBytes = int64_t(128) << 20;

  TokenStream() = default;
  explicit TokenStream(std::vector<std::shared_ptr<const Shard>> parts);
  // Maps each file in order, and each one's document index (data/doc_index.h) where one lies
  // beside it (validated against its shard's token count).
  static TokenStream map_files(const std::vector<std::string>& files);
  // Document indexes, one per part (all of them, or the stream has none).
  void set_doc_indexes(std::vector<std::shared_ptr<const DocIndex>> docs);
  // Whether every part has a document index; if not, missing_doc_index() names the first
  // missing file.
  bool has_doc_index() const { return !docs_.empty(); }
  const std::string& missing_doc_index() const { return missing_docs_; }
  // Stream positions p in [begin, begin + n) where a document starts, in order (appended).
  void doc_starts(int64_t begin, int64_t n, std::vector<int64_t>& out) const;

  int64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  size_t parts() const { return parts_.size(); }
  const Shard& part(size_t i) const { return *parts_[i]; }
  // Tokens [begin, begin + n) of the concatenation into out. A token >= the vocabulary (see
  // set_vocab) is an input error naming its shard and position: shards are not scanned whole
  // when opened, so every token is checked where it is read.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  void set_vocab(int64_t vocab) { vocab_ = vocab; }
  // The largest of the first `per_part` tokens of each shard (a bounded look at the data).
  uint32_t max_token_sampled(int64_t per_part) const;
  // The whole stream in memory (tests and small tools).
  std::vector<uint32_t> to_vector() const;

 private:
  std::vector<std::shared_ptr<const Shard>> parts_;
  std::vector<int64_t> ends_;  // ends_[i]: end of part i in the concatenation
  std::vector<std::shared_ptr<const DocIndex>> docs_;  // per part, or empty
  std::string missing_docs_;                           // the first part's index not found
  int64_t vocab_ = int64_t(1) << 32;
  mutable int64_t mapped_bytes_ = 0;  // an upper bound of what reads have mapped since a release
};

}  // namespace trellis
