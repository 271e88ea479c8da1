// Token shard reader (data/shard): 256-int32 header (magic, version, count), uint16 or uint32
// tokens, size == header + count * width.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "trellis/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  const std::string path =
      fuzz::write_scratch("shard.bin", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_parse_or_input_error([&] {
    const Shard s(path);
    fuzz::require(s.size() >= 0, "a shard has a non-negative token count");
    const int64_t width = s.version() == kShardVersion16 ? 2 : 4;
    fuzz::require(size_t(1024 + width * s.size()) == size, "header + count * width == file size");
    std::vector<uint32_t> tokens(size_t(s.size()));
    s.read(0, s.size(), tokens.data());
    for (int64_t i = 0; i < s.size(); ++i)
      fuzz::require(s.token(i) == tokens[size_t(i)], "token(i) agrees with read()");
  });
  return 0;
}
