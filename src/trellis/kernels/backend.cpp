#include "trellis/kernels/backend.h"

#include <atomic>
#include <iterator>

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

// Installed tables by device (null: the built-in one).
std::atomic<const Backend*> g_installed[2];

std::atomic<const Backend*>& slot(Device device) {
  const auto i = static_cast<size_t>(device);
  TRELLIS_CHECK(i < std::size(g_installed), "unknown device {}", i);
  return g_installed[i];
}
}  // namespace

const Backend& backend(Device device) {
  if (const Backend* table = slot(device).load(std::memory_order_acquire)) return *table;
  TRELLIS_REQUIRE(device == Device::CPU, "this build of trellis has no kernels for that device");
  return kCpu;
}

const Backend* set_backend(Device device, const Backend* table) {
  TRELLIS_CHECK(!table || table->device == device, "a kernel table installed for another device");
  return slot(device).exchange(table, std::memory_order_acq_rel);
}

}  // namespace trellis
