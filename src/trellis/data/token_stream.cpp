#include "trellis/data/token_stream.h"

#include <algorithm>
#include <filesystem>

#include "trellis/core/error.h"

namespace trellis {

TokenStream::TokenStream(std::vector<std::shared_ptr<const Shard>> parts)
    : parts_(std::move(parts)) {
  int64_t end = 0;
  for (const auto& p : parts_) ends_.push_back(end += p->size());
}

TokenStream TokenStream::map_files(const std::vector<std::string>& files) {
  std::vector<std::shared_ptr<const Shard>> parts;
  std::vector<std::shared_ptr<const DocIndex>> docs;
  std::string missing;
  for (const auto& f : files) {
    parts.push_back(std::make_shared<const Shard>(f));
    const std::string idx = doc_index_path(f);
    std::error_code ec;
    if (std::filesystem::exists(idx, ec))
      docs.push_back(std::make_shared<const DocIndex>(idx, parts.back()->size()));
    else if (missing.empty())
      missing = idx;
  }
  TokenStream s(std::move(parts));
  if (missing.empty() && !docs.empty())
    s.set_doc_indexes(std::move(docs));
  else
    s.missing_docs_ = missing;
  return s;
}

void TokenStream::set_doc_indexes(std::vector<std::shared_ptr<const DocIndex>> docs) {
  TRELLIS_CHECK(docs.size() == parts_.size(), "{} document indexes for {} shards", docs.size(),
                parts_.size());
  docs_ = std::move(docs);
  missing_docs_.clear();
}

void TokenStream::doc_starts(int64_t begin, int64_t n, std::vector<int64_t>& out) const {
  TRELLIS_CHECK(has_doc_index(), "doc_starts of a stream without document indexes");
  TRELLIS_CHECK(begin >= 0 && n >= 0 && begin + n <= size(), "starts in [{}, {}) of a stream of {}",
                begin, begin + n, size());
  size_t i = size_t(std::upper_bound(ends_.begin(), ends_.end(), begin) - ends_.begin());
  for (int64_t pos = begin; pos < begin + n; ++i) {
    const int64_t start = ends_[i] - parts_[i]->size();
    const int64_t stop = std::min(begin + n, ends_[i]);
    const size_t first = out.size();
    docs_[i]->starts_in(pos - start, stop - start, out);
    for (size_t k = first; k < out.size(); ++k) out[k] += start;
    pos = stop;
  }
}

void TokenStream::read(int64_t begin, int64_t n, int32_t* out) const {
  TRELLIS_CHECK(begin >= 0 && n >= 0 && begin + n <= size(), "tokens [{}, {}) of a stream of {}",
                begin, begin + n, size());
  // A read faults in at most a 2 MB folio at each end, plus what lies between.
  mapped_bytes_ += 2 * (int64_t(2) << 20) + 4 * n;
  if (mapped_bytes_ > kReleaseBytes) {
    for (const auto& p : parts_) p->release_pages();
    mapped_bytes_ = 0;
  }
  // The part holding `begin`: the first whose end lies beyond it.
  size_t i = size_t(std::upper_bound(ends_.begin(), ends_.end(), begin) - ends_.begin());
  for (int64_t pos = begin; pos < begin + n; ++i) {
    const Shard& s = *parts_[i];
    const int64_t start = ends_[i] - s.size();
    const int64_t stop = std::min(begin + n, ends_[i]);
    for (int64_t k = pos; k < stop; ++k) {
      const uint32_t v = s.token(k - start);
      TRELLIS_REQUIRE(int64_t(v) < vocab_,
                      "{}: token {} at position {} is outside the vocabulary ({} tokens)", s.name(),
                      v, k - start, vocab_);
      *out++ = int32_t(v);
    }
    pos = stop;
  }
}

uint32_t TokenStream::max_token_sampled(int64_t per_part) const {
  uint32_t m = 0;
  for (const auto& p : parts_)
    for (int64_t k = 0, n = std::min(per_part, p->size()); k < n; ++k) m = std::max(m, p->token(k));
  return m;
}

std::vector<uint32_t> TokenStream::to_vector() const {
  std::vector<uint32_t> out;
  out.reserve(size_t(size()));
  for (const auto& p : parts_)
    for (int64_t k = 0; k < p->size(); ++k) out.push_back(p->token(k));
  return out;
}

}  // namespace trellis
