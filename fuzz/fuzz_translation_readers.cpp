// Inputs of `prepare --task translate` (data/task_readers): source<TAB>target TSV, gettext .po
// and compiled .mo catalogues. The first byte picks the reader, the rest is the file.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_common.h"
#include "trellis/data/task_readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  if (size == 0) return 0;
  const int reader = data[0] % 3;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_parse_or_input_error([&] {
    const PairFile f = reader == 0   ? parse_translation_tsv(body, "pairs.tsv")
                       : reader == 1 ? parse_po(body, "messages.po")
                                     : parse_mo(body, "messages.mo");
    for (const PairRecord& r : f.pairs) {
      fuzz::require(r.line >= 1, "pairs name a line or entry");
      (void)f.where(r);
    }
  });
  return 0;
}
