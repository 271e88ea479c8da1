#include "trellis/io/pretrained.h"

#include "trellis/core/error.h"

namespace trellis {

// Being written (issue 10): see pretrained.h.
ModelConfig pretrained_model_config(const std::string& dir) {
  TRELLIS_REQUIRE(false, "{}: --init-from is not implemented yet", dir);
  return {};
}

PretrainedReport load_pretrained(const std::string& dir, const ParamLayout&, float*) {
  TRELLIS_REQUIRE(false, "{}: --init-from is not implemented yet", dir);
  return {};
}

}  // namespace trellis
