#include "trellis/kernels/backend.h"

#include "trellis/core/error.h"

namespace trellis {

namespace {
const Backend kCpu = {
    Device::CPU,
    ops::gemm,
    ops::add_bias,
    ops::fill_rows,
    ops::bias_backward,
    ops::layernorm_forward,
    ops::layernorm_backward,
    ops::rmsnorm_forward,
    ops::rmsnorm_backward,
    ops::gelu_forward,
    ops::gelu_backward,
    ops::swiglu_forward,
    ops::swiglu_backward,
    ops::rope_forward,
    ops::rope_backward,
    ops::attention_forward,
    ops::attention_backward,
    ops::embedding_forward,
    ops::embedding_backward,
    ops::position_forward,
    ops::position_backward,
    ops::cross_entropy,
    ops::accumulate,
    ops::zero,
};
}  // namespace

const Backend& backend(Device device) {
  TRELLIS_REQUIRE(device == Device::CPU, "this build of trellis has no kernels for that device");
  return kCpu;
}

}  // namespace trellis
