#pragma once
// The analytic model of activation memory: from the sizes alone, the bytes Transformer::prepare
// allocates for one micro-batch's Context and for the model's workspace, under each recompute
// policy. It restates what the code allocates, tensor by tensor (test_activation_memory checks it
// against Context::activation_bytes and Transformer::workspace_bytes exactly); docs/design.md
// compares it with Korthikanti et al. 2022's per-layer formula.
#include <cstdint>

#include "trellis/core/tensor.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/transformer.h"

namespace trellis {

struct ActivationMemory {
  // One Context after a training forward: everything it keeps for its backward
  // (Context::activation_bytes). A pipeline rank holds up to its schedule's peak of these.
  int64_t context = 0;
  // ... of which its blocks' (the sum of block_activation_bytes over the chunk's blocks).
  int64_t blocks = 0;
  // The model's workspace (Transformer::workspace_bytes), one per model chunk whatever the number
  // of Contexts: backward's gradient buffers and the block that recompute rebuilds. Allocated at
  // prepare and held, so it is the peak extra while one block's backward (recompute included)
  // runs; kernels' own temporaries (see docs/design.md) come on top.
  int64_t workspace = 0;
};

// For micro-batches of B sequences of T tokens on the chunk `chunk` of the model, at
// tensor-parallel size tp (with or without sequence parallelism). Activations are fp32 whatever
// the compute precision (bf16 rounds GEMM operands only), so `compute` changes nothing here.
ActivationMemory activation_memory(const ModelConfig& cfg, const StageSpec& chunk, int64_t B,
                                   int64_t T, int tp, bool sequence_parallel, Recompute recompute,
                                   DType compute = DType::F32);

// The bytes one block keeps in a Context (decoder: an encoder-decoder's decoder block, with
// cross-attention): the per-layer term of the model.
int64_t block_activation_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T, int tp,
                               bool sequence_parallel, Recompute recompute);

// ... of which attention's probabilities (self-attention's, and a decoder's cross-attention's):
// B x heads/tp x T x T each, unless recomputation drops them.
int64_t block_probability_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T, int tp);

}  // namespace trellis
