// A checkpoint's state.json (io/checkpoint): a JSON object with a non-negative integer "step".
#include <cstdint>
#include <string>

#include "fuzz/fuzz_common.h"
#include "trellis/io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  fuzz::expect_parse_or_input_error([&] {
    const nlohmann::json state = parse_checkpoint_state(
        std::string(reinterpret_cast<const char*>(data), size), "state.json");
    // What the trainer reads on --resume.
    fuzz::require(state.at("step").get<int64_t>() >= 0, "a non-negative step");
  });
  return 0;
}
