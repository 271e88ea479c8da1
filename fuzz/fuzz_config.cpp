// The training configuration (train/config): a TOML file (--config) and --set key=value
// overrides, then the model they describe. The input is the TOML text, then after the first NUL
// byte one --set argument per line.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_common.h"
#include "trellis/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string toml = fuzz::write_scratch("config.toml", in.substr(0, nul));
  fuzz::expect_parse_or_input_error([&] {
    TrainConfig c;
    std::vector<ConfigKey> keys = config_keys(c);
    apply_toml_file(keys, toml);
    std::string_view sets = nul == std::string_view::npos ? "" : in.substr(nul + 1);
    while (!sets.empty()) {  // as train_command splits each --set
      const size_t nl = sets.find('\n');
      const std::string s(sets.substr(0, nl));
      sets = nl == std::string_view::npos ? "" : sets.substr(nl + 1);
      const size_t eq = s.find('=');
      TRELLIS_REQUIRE(eq != std::string::npos && eq > 0, "--set expects key=value, got '{}'", s);
      apply_setting(keys, s.substr(0, eq), s.substr(eq + 1));
    }
    (void)dump_config(keys);
    // init_from would read a directory the input names; the model of a preset is pure.
    if (c.init_from.empty()) (void)c.model_config(256);
  });
  return 0;
}
