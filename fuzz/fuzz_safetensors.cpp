// safetensors reader (io/safetensors): header length, JSON header, dtypes, shapes, offsets.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_common.h"
#include "trellis/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  fuzz::expect_parse_or_input_error([&] {
    const SafetensorsFile f = SafetensorsFile::from_bytes(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
    for (const std::string& name : f.names()) {
      uint64_t count = 1;
      for (int64_t d : f.shape(name)) count *= uint64_t(d);
      const std::string& dtype = f.dtype(name);
      if (dtype == "F32" || dtype == "F16" || dtype == "BF16") {
        // Every value is read: ASan sees any offset past the data.
        const std::vector<float> v = f.floats(name);
        fuzz::require(v.size() == count, "floats() returns shape-product values");
        if (dtype == "F32" && count > 0) {
          volatile float last = f.data(name)[count - 1];
          (void)last;
        }
      } else {
        // Another dtype is an input error naming the tensor, never a read.
        bool refused = false;
        try {
          f.floats(name);
        } catch (const Error&) {
          refused = true;
        }
        fuzz::require(refused, "floats() refuses a non-float dtype");
      }
    }
    (void)f.metadata();
  });
  return 0;
}
