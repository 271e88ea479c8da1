#pragma once
// The activation layout of a model chunk, from the sizes alone: the shape and dtype of every tensor
// ModelChunk::prepare allocates for one micro-batch's Context and for the model's workspace,
// under each recompute policy. ModelChunk::prepare allocates from this table and
// activation_memory sums it, so a tensor added or resized here changes both (the only place a
// size is written down); test_activation_memory checks the sums against Context::activation_bytes
// and ModelChunk::workspace_bytes, and docs/design.md compares them with Korthikanti et al.
// 2022's per-layer formula.
#include <cstdint>
#include <vector>

#include "trellis/core/tensor.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/model_chunk.h"

namespace trellis {

// The widths one tensor-parallel rank of a model works with, for micro-batches of B x T.
struct ActivationDims {
  int64_t B = 0, T = 0, BT = 0;
  int64_t R = 0;      // rows this rank holds outside tensor-parallel regions (BT / tp under SP)
  int64_t full = 0;   // rows of the gathered copies sequence parallelism keeps (0 without it)
  int64_t stats = 0;  // rows of a norm's mean (LayerNorm; RMSNorm keeps none)
  int64_t C = 0;
  int64_t Hl = 0;          // local attention heads
  int64_t qkv = 0;         // q|k|v width
  int64_t att = 0;         // attention output width
  int64_t kv2 = 0;         // cross-attention's keys|values width
  int64_t up = 0;          // the MLP's up projection width (gate|up for SwiGLU; 0 without an MLP)
  int64_t act = 0;         // the MLP activation's width
  int64_t vocab_rows = 0;  // this rank's slice of the padded vocabulary (ParamLayout::vocab_local)
};
// For tensor-parallel size tp; sequence parallelism applies only when tp > 1.
ActivationDims activation_dims(const ModelConfig& cfg, int64_t B, int64_t T, int tp,
                               bool sequence_parallel);

// What a chunk of the model contains, and for an encoder-decoder where it sits around the
// encoder/decoder boundary.
struct ChunkRole {
  bool embedding = false, head = false;
  bool decoder_start = false;  // holds the first decoder block (the encoder's final norm too)
  bool has_decoder = false;    // holds a decoder block
  bool carry_in = false;       // receives [hidden; encoder output] from the stage before
  bool carry_out = false;      // sends [hidden; encoder output] to the stage after
};
ChunkRole chunk_role(const ModelConfig& cfg, const StageSpec& chunk);

// A block's tensors fall in three groups: `Inner` (all that full recompute does not keep but the
// Recomputable ones, attention's O(T) logsumexp included), `Recomputable` (the MLP's up
// projection and activation: what selective recompute does not keep) and `Output` (the block's output, always
// kept). The workspace holds, for one block, the groups a Context does not. `WeightGrad`: the
// output gradients of the row-parallel projections that a split backward (zb1) keeps from its
// input part for its weight part, held only by such a Context (never rebuilt, no workspace). The
// column-parallel layers' output gradients need no tensor of their own: the input part leaves
// them in q|k|v, the MLP's up projection and cross-attention's queries and keys|values, which it
// has read by then (where one of them is kept in bf16, too narrow for an fp32 gradient, a WeightGrad
// tensor of its own holds it).
enum class ActGroup : uint8_t { Inner, Recomputable, Output, WeightGrad };
bool context_keeps(Recompute policy, ActGroup group, bool split_backward = false);
// Whether the workspace holds (one block's copy of) a group a Context does not keep.
bool rebuilt_in_workspace(Recompute policy, ActGroup group);

struct BlockTensor {
  Tensor Context::BlockActs::*member;
  ActGroup group;
  std::vector<int64_t> shape;  // when kept; a leading 0: the block has no such tensor
  DType dtype = DType::F32;
};
struct ContextTensor {
  Tensor Context::*member;
  std::vector<int64_t> shape;  // a leading 0: this chunk has no such tensor
  DType dtype = DType::F32;
};
// Backward's gradient scratch of a chunk (floats of ModelChunk's private buffers).
struct GradScratch {
  int64_t full = 0, dres = 0, dln = 0, dfull = 0, dqkv = 0, datt = 0, dup = 0, dact = 0;
  int64_t denc = 0, denc_full = 0, dxq = 0, dxkv = 0;  // cross-attention
  int64_t floats() const;
};

// The tensors of one block (decoder: with cross-attention). compute BF16: the saved inputs of
// linear layers that a GEMM reads directly (the norms' outputs feeding q|k|v, the MLP and
// cross-attention's queries without sequence parallelism, whose gathers run in fp32; the MLP's
// activation feeding its down projection) are kept as the bf16 the GEMMs round them to, and
// the outputs of q|k|v (after RoPE; attention reads them) and of the MLP's up projection
// (GELU/SwiGLU's input) in bf16, as autocast keeps them. Everything else stays fp32.
std::vector<BlockTensor> block_tensors(const ModelConfig& cfg, const ActivationDims& d,
                                       bool decoder, DType compute = DType::F32);

struct ActivationLayout {
  ActivationDims dims;
  ChunkRole role;
  std::vector<std::vector<BlockTensor>> blocks;  // per block of the chunk, in order
  // The block whose groups the workspace holds (a decoder block if the chunk has one: the
  // largest).
  std::vector<BlockTensor> workspace_block;
  std::vector<ContextTensor> context;  // the chunk's tensors outside its blocks
  GradScratch scratch;
};
// compute BF16: the language-model head's input (the final norm's output, without sequence
// parallelism) is kept in bf16 too, as are the blocks' (block_tensors).
ActivationLayout activation_layout(const ModelConfig& cfg, const StageSpec& chunk, int64_t B,
                                   int64_t T, int tp, bool sequence_parallel,
                                   DType compute = DType::F32);

struct ActivationMemory {
  // One Context after a training forward: everything it keeps for its backward
  // (Context::activation_bytes). A pipeline rank holds up to its schedule's peak of these.
  int64_t context = 0;
  // ... of which its blocks' (the sum of block_activation_bytes over the chunk's blocks).
  int64_t blocks = 0;
  // The model's workspace (ModelChunk::workspace_bytes), one per model chunk whatever the number
  // of Contexts: backward's gradient buffers and the block that recompute rebuilds. Allocated at
  // prepare and held, so it is the peak extra while one block's backward (recompute included)
  // runs; kernels' own temporaries (see docs/design.md) come on top.
  int64_t workspace = 0;
};

// The bytes of a layout under a recompute policy (each tensor in its dtype); split_backward: the
// Contexts of a schedule that splits backwards (zb1), which keep the WeightGrad group too.
ActivationMemory activation_memory(const ActivationLayout& layout, Recompute recompute,
                                   bool split_backward = false);

// For micro-batches of B sequences of T tokens on the chunk `chunk` of the model, at
// tensor-parallel size tp (with or without sequence parallelism), in compute precision `compute`
// (BF16 keeps the saved inputs of linear layers in bf16; activation_layout).
ActivationMemory activation_memory(const ModelConfig& cfg, const StageSpec& chunk, int64_t B,
                                   int64_t T, int tp, bool sequence_parallel, Recompute recompute,
                                   DType compute = DType::F32, bool split_backward = false);

// The bytes one block keeps in a Context (decoder: an encoder-decoder's decoder block, with
// cross-attention): the per-layer term of the model.
int64_t block_activation_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T, int tp,
                               bool sequence_parallel, Recompute recompute,
                               DType compute = DType::F32);

// ... of which what attention saves for its backward (self-attention's, and a decoder's
// cross-attention's): the tiled kernel's logsumexp, B x heads/tp x T floats each, unless
// recomputation drops it.
int64_t block_attention_state_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T,
                                    int tp);

}  // namespace trellis
