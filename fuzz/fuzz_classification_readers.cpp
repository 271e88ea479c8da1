// Inputs of `prepare --task classify` (data/task_readers): labelled texts as TSV, CSV (RFC 4180)
// or JSONL, and idx (MNIST) image and label files. The first byte picks the reader, the rest is
// the file.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_common.h"
#include "trellis/data/task_readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  if (size == 0) return 0;
  const int reader = data[0] % 5;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_parse_or_input_error([&] {
    if (reader <= 2) {
      const char* ext[] = {".tsv", ".csv", ".jsonl"};
      const std::string path = fuzz::write_scratch(std::string("input") + ext[reader], body);
      for (const TextRecord& r : read_classification_file(path))
        fuzz::require(r.line >= 1, "records name a line");
    } else if (reader == 3) {
      const IdxImages im = parse_idx_images(body, "images-idx3-ubyte");
      fuzz::require(im.pixels.size() == uint64_t(im.count) * uint64_t(im.rows) * uint64_t(im.cols),
                    "count * rows * cols pixel bytes");
    } else {
      fuzz::require(parse_idx_labels(body, "labels-idx1-ubyte").size() + 8 == body.size(),
                    "one label per byte after the header");
    }
  });
  return 0;
}
