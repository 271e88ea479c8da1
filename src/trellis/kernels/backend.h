#pragma once
// The one way model code reaches kernels: a table of the op set for a device. The CPU table holds
// the functions of kernels/ops.h. A CUDA table would hold functions of the same signatures over
// device pointers, but the model would still need work: ModelChunk allocates its Context on
// Device::CPU and runs a few host loops and copies of its own (embedding offsets, pooling, head
// padding) outside this table.
#include "trellis/core/tensor.h"
#include "trellis/kernels/ops.h"

namespace trellis {

struct Backend {
  Device device;
  decltype(&ops::gemm) gemm;
  // The same GEMM over operands that may be bf16 already (the bf16 table only gets such ones).
  decltype(&ops::gemm_operands) gemm_operands;
  decltype(&ops::to_bf16) to_bf16;
  decltype(&ops::add_bias) add_bias;
  decltype(&ops::fill_rows) fill_rows;
  decltype(&ops::bias_backward) bias_backward;
  decltype(&ops::layernorm_forward) layernorm_forward;
  decltype(&ops::layernorm_backward) layernorm_backward;
  decltype(&ops::rmsnorm_forward) rmsnorm_forward;
  decltype(&ops::rmsnorm_backward) rmsnorm_backward;
  decltype(&ops::gelu_forward) gelu_forward;
  decltype(&ops::gelu_backward) gelu_backward;
  decltype(&ops::gelu_bias_forward) gelu_bias_forward;
  decltype(&ops::swiglu_forward) swiglu_forward;
  decltype(&ops::swiglu_backward) swiglu_backward;
  decltype(&ops::gelu_forward_bf16) gelu_forward_bf16;
  decltype(&ops::gelu_backward_bf16) gelu_backward_bf16;
  decltype(&ops::swiglu_forward_bf16) swiglu_forward_bf16;
  decltype(&ops::swiglu_backward_bf16) swiglu_backward_bf16;
  decltype(&ops::rope_forward) rope_forward;
  decltype(&ops::rope_backward) rope_backward;
  void (*attention_forward)(float*, float*, const float*, int64_t, const float*, const float*,
                            int64_t, const ops::AttentionShape&);
  void (*attention_backward)(float*, float*, float*, const float*, const float*, int64_t,
                             const float*, const float*, int64_t, const float*, const float*,
                             const ops::AttentionShape&);
  decltype(&ops::attention_forward_bf16) attention_forward_bf16;
  decltype(&ops::attention_backward_bf16) attention_backward_bf16;
  decltype(&ops::attention_cached) attention_cached;
  decltype(&ops::embedding_forward) embedding_forward;
  decltype(&ops::embedding_backward) embedding_backward;
  decltype(&ops::position_forward) position_forward;
  decltype(&ops::position_backward) position_backward;
  decltype(&ops::embedding_forward_bf16) embedding_forward_bf16;
  decltype(&ops::position_forward_bf16) position_forward_bf16;
  decltype(&ops::cross_entropy) cross_entropy;
  decltype(&ops::cross_entropy_bf16) cross_entropy_bf16;
  decltype(&ops::dropout) dropout;
  decltype(&ops::accumulate) accumulate;
  decltype(&ops::zero) zero;
};

// The kernels of a device for a compute precision: the installed table if there is one
// (set_backend), else the one this build ships (CPU: the functions of kernels/ops.h); an input
// error if there is neither. Models take it once, at construction. With `compute` = BF16 the
// GEMMs take bf16 operands and accumulate in fp32 (ops::gemm_bf16, gemm_bf16_operands), as
// PyTorch's autocast does; the model keeps bf16 copies of what they read (model/modules.h), while
// every other op, the master weights and the gradients stay fp32. Callers check the CPU can
// (cpu_isa).
const Backend& backend(Device device, DType compute = DType::F32);

// Installs `table` as the kernels of `device` (null: back to the built-in ones) and returns the
// table it replaces (null: the built-in ones), so a caller can put it back. This is how a tool
// swaps the kernels without touching model code: a profiler installs entries that time the
// built-in ones, and a CUDA build can register its table. Objects keep the table they took at
// construction, so install before building a model. `table` is not copied and must outlive its
// users; install at start-up, not while other threads run kernels.
const Backend* set_backend(Device device, const Backend* table, DType compute = DType::F32);

}  // namespace trellis
