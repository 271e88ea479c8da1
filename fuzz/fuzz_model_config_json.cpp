// A checkpoint's or Hugging Face directory's config.json (io/checkpoint, model/families): the
// family's keys, the "trellis" section, sizes within bounds and a model of bounded size.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_common.h"
#include "trellis/io/checkpoint.h"
#include "trellis/model/params.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  fuzz::expect_parse_or_input_error([&] {
    const ModelConfig m =
        parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    m.validate();  // what was accepted is a model trellis can build
    const ParamLayout layout(m);
    fuzz::require(layout.count() > 0 && layout.count() <= kMaxParams, "a bounded model");
  });
  return 0;
}
