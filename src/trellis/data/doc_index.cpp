#include "trellis/data/doc_index.h"

#include <algorithm>
#include <cstring>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"

namespace trellis {

namespace {
constexpr size_t kHeaderBytes = kDocIndexHeaderInts * sizeof(int32_t);
}

std::string doc_index_path(const std::string& shard_path) {
  const std::string ext = ".bin";
  if (shard_path.size() >= ext.size() &&
      shard_path.compare(shard_path.size() - ext.size(), ext.size(), ext) == 0)
    return shard_path.substr(0, shard_path.size() - ext.size()) + ".idx";
  return shard_path + ".idx";
}

DocIndex::DocIndex(const std::string& path, int64_t shard_tokens) : name_(path), file_(path) {
  const size_t bytes = file_.size();
  TRELLIS_REQUIRE(bytes >= kHeaderBytes,
                  "{}: truncated: {} bytes, shorter than the {}-byte document index header", path,
                  bytes, kHeaderBytes);
  int32_t h[kDocIndexHeaderInts];
  std::memcpy(h, file_.data(), kHeaderBytes);
  TRELLIS_REQUIRE(h[0] == kDocIndexMagic, "{}: bad magic {} (expected {}): not a document index",
                  path, h[0], kDocIndexMagic);
  TRELLIS_REQUIRE(h[1] == kDocIndexVersion, "{}: unsupported document index version {} (expected "
                  "{})", path, h[1], kDocIndexVersion);
  TRELLIS_REQUIRE(int64_t(h[2]) == shard_tokens,
                  "{}: the document index is for {} tokens, but its shard holds {}", path, h[2],
                  shard_tokens);
  TRELLIS_REQUIRE(h[3] >= 0 && int64_t(h[3]) <= shard_tokens,
                  "{}: {} document starts in a shard of {} tokens", path, h[3], shard_tokens);
  const size_t payload = bytes - kHeaderBytes;
  TRELLIS_REQUIRE(payload == 4 * size_t(h[3]),
                  "{}: header says {} document starts, the file holds {} bytes of them", path,
                  h[3], payload);
  n_ = h[3];
  tokens_ = shard_tokens;
  data_ = file_.data() + kHeaderBytes;
}

DocIndex::DocIndex(std::vector<uint32_t> starts, int64_t tokens, std::string name)
    : name_(std::move(name)), owned_(std::move(starts)) {
  data_ = reinterpret_cast<const uint8_t*>(owned_.data());
  n_ = int64_t(owned_.size());
  tokens_ = tokens;
}

uint32_t DocIndex::at(int64_t i) const {
  uint32_t v;
  std::memcpy(&v, data_ + 4 * i, 4);
  return v;
}

void DocIndex::starts_in(int64_t lo, int64_t hi, std::vector<int64_t>& out) const {
  // Binary search over the mapped entries (reads O(log n) of them).
  int64_t a = 0, b = n_;
  while (a < b) {
    const int64_t m = a + (b - a) / 2;
    if (int64_t(at(m)) < lo)
      a = m + 1;
    else
      b = m;
  }
  int64_t prev = a > 0 ? int64_t(at(a - 1)) : -1;
  for (int64_t i = a; i < n_; ++i) {
    const int64_t s = at(i);
    TRELLIS_REQUIRE(s > prev && s < tokens_,
                    "{}: document start {} (entry {}) is not increasing within the {} tokens of "
                    "its shard",
                    name_, s, i, tokens_);
    if (s >= hi) break;
    if (s >= lo) out.push_back(s);
    prev = s;
  }
}

void write_doc_index(const std::string& path, std::span<const uint32_t> starts, int64_t tokens) {
  TRELLIS_CHECK(tokens >= 0 && tokens <= INT32_MAX, "{}: {} tokens", path, tokens);
  for (size_t i = 0; i < starts.size(); ++i)
    TRELLIS_CHECK(int64_t(starts[i]) < tokens && (i == 0 || starts[i] > starts[i - 1]),
                  "{}: document start {} out of order", path, starts[i]);
  int32_t h[kDocIndexHeaderInts] = {};
  h[0] = kDocIndexMagic;
  h[1] = kDocIndexVersion;
  h[2] = int32_t(tokens);
  h[3] = int32_t(starts.size());
  std::string bytes(kHeaderBytes + 4 * starts.size(), '\0');
  std::memcpy(bytes.data(), h, kHeaderBytes);
  if (!starts.empty()) std::memcpy(bytes.data() + kHeaderBytes, starts.data(), 4 * starts.size());
  write_file_atomic(path, bytes);
}

}  // namespace trellis
