// Document index reader (data/doc_index): 8-int32 header (magic, version, the shard's token count,
// n), then n uint32 starts, strictly increasing and below the count (checked where read).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "trellis/data/doc_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  const std::string path =
      fuzz::write_scratch("doc.idx", std::string_view(reinterpret_cast<const char*>(data), size));
  // The shard it describes: as many tokens as the header says (so the other checks are reached),
  // and a fixed count (so the disagreement is too).
  int32_t claimed = 0;
  if (size >= 12) std::memcpy(&claimed, data + 8, 4);
  for (const int64_t tokens : {int64_t(claimed), int64_t(1000)}) {
    fuzz::expect_parse_or_input_error([&] {
      const DocIndex idx(path, tokens);
      fuzz::require(idx.size() >= 0 && idx.size() <= tokens, "0 <= starts <= tokens");
      std::vector<int64_t> all, part;
      idx.starts_in(0, tokens, all);
      for (size_t i = 0; i < all.size(); ++i)
        fuzz::require(all[i] >= 0 && all[i] < tokens && (i == 0 || all[i] > all[i - 1]),
                      "starts increase inside the shard");
      idx.starts_in(tokens / 2, tokens, part);
      for (int64_t s : part) fuzz::require(s >= tokens / 2, "a range's starts lie in it");
    });
  }
  return 0;
}
