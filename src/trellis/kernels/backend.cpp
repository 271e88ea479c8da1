#include "trellis/kernels/backend.h"

#include <atomic>
#include <iterator>

#include "trellis/core/error.h"

namespace trellis {

namespace {
const Backend kCpu = {
    Device::CPU,
    ops::gemm,
    ops::gemm_operands,
    ops::to_bf16,
    ops::add_bias,
    ops::fill_rows,
    ops::bias_backward,
    ops::layernorm_forward,
    ops::layernorm_backward,
    ops::rmsnorm_forward,
    ops::rmsnorm_backward,
    ops::gelu_forward,
    ops::gelu_backward,
    ops::gelu_bias_forward,
    ops::swiglu_forward,
    ops::swiglu_backward,
    ops::gelu_forward_bf16,
    ops::gelu_backward_bf16,
    ops::swiglu_forward_bf16,
    ops::swiglu_backward_bf16,
    ops::rope_forward,
    ops::rope_backward,
    ops::attention_forward,
    ops::attention_backward,
    ops::attention_forward_bf16,
    ops::attention_backward_bf16,
    ops::attention_cached,
    ops::embedding_forward,
    ops::embedding_backward,
    ops::position_forward,
    ops::position_backward,
    ops::embedding_forward_bf16,
    ops::position_forward_bf16,
    ops::cross_entropy,
    ops::cross_entropy_bf16,
    ops::dropout,
    ops::accumulate,
    ops::zero,
};

// The autocast table: the same ops, GEMMs on bf16 operands.
const Backend kCpuBf16 = [] {
  Backend b = kCpu;
  b.gemm = ops::gemm_bf16;
  b.gemm_operands = ops::gemm_bf16_operands;
  return b;
}();

// Installed tables by device and compute precision (null: the built-in one).
std::atomic<const Backend*> g_installed[2][2];

std::atomic<const Backend*>& slot(Device device, DType compute) {
  const auto i = static_cast<size_t>(device), j = static_cast<size_t>(compute);
  TRELLIS_CHECK(i < std::size(g_installed) && j < std::size(g_installed[0]),
                "unknown device {} or precision {}", i, j);
  return g_installed[i][j];
}
}  // namespace

const Backend& backend(Device device, DType compute) {
  if (const Backend* table = slot(device, compute).load(std::memory_order_acquire)) return *table;
  TRELLIS_REQUIRE(device == Device::CPU, "this build of trellis has no kernels for that device");
  return compute == DType::BF16 ? kCpuBf16 : kCpu;
}

const Backend* set_backend(Device device, const Backend* table, DType compute) {
  TRELLIS_CHECK(!table || table->device == device, "a kernel table installed for another device");
  return slot(device, compute).exchange(table, std::memory_order_acq_rel);
}

}  // namespace trellis
