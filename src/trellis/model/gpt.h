#pragma once
// GPT-2 as embedding, blocks and head with explicit forward/backward. Parameters and gradients
// are views into flat buffers (this rank's tensor-parallel slices); the activations of one
// micro-batch live in a Context. Tensor parallelism enters only through the TensorParallel
// operators around each column → row-parallel pair (attention, MLP, vocabulary).
#include <cstdint>
#include <functional>
#include <vector>

#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/parallel/tensor_parallel.h"

namespace trellis {

// Everything one micro-batch's forward saves for its backward. "local" tensors hold this rank's
// rows (all rows unless sequence parallelism splits them); "full" ones all B*T rows.
struct Context {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;  // [B*T]
  std::vector<float> embedded;           // [local, C] input of block 0
  struct BlockActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, ln1_full, qkv, probs, att, res_mid;
    std::vector<float> ln2, ln2_mean, ln2_rstd, ln2_full, fc, gelu, res_out;
  };
  std::vector<BlockActs> blocks;
  std::vector<float> lnf, lnf_mean, lnf_rstd, lnf_full, logits, losses;
  // Pipeline stages after the first: the activation received from the previous stage, and the
  // gradient of it that backward produces; stages before the last: the received output gradient.
  std::vector<float> input, dinput, doutput;
};

struct BlockParams {
  const float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
  const float *ln2_w, *ln2_b, *fc_w, *fc_b, *mlp_proj_w, *mlp_proj_b;
};
struct BlockGrads {
  float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *mlp_proj_w, *mlp_proj_b;
};

class GPT {
 public:
  // params/grads: flat buffers laid out by `layout` (grads may be null for inference). tp: the
  // tensor-parallel group (size 1 for a single rank); it must outlive the model. chunk: the part
  // of layout's stage this object runs (a pipeline model chunk; default: all of it).
  GPT(const ModelConfig& cfg, const ParamLayout& layout, float* params, float* grads,
      TensorParallel& tp, const StageSpec* chunk = nullptr);

  const ModelConfig& config() const { return cfg_; }
  // Sizes ctx's buffers for micro-batches of B sequences of T tokens.
  void prepare(Context& ctx, int64_t B, int64_t T);

  // Forward over ctx.tokens (or ctx.input after the first stage) and, on the last stage,
  // ctx.targets: returns the summed loss of all B*T targets (0 before the last stage). When
  // grad_scale != 0 the head already turns logits into dlogits (grad_scale = 1/global tokens).
  double forward(Context& ctx, float grad_scale);
  // The activation a stage hands to the next one ([local rows, C]).
  const float* output(const Context& ctx) const { return ctx.blocks.back().res_out.data(); }
  bool has_embedding() const { return chunk_.embedding; }
  bool has_head() const { return chunk_.head; }
  // Backward of the micro-batch in ctx (after forward with grad_scale != 0; before the last stage
  // from ctx.doutput, after the first stage leaving d(input) in ctx.dinput); accumulates into the
  // gradient buffer. last_micro_step: gradients are complete after this backward, so partial
  // gradients of replicated parameters are combined across the tensor-parallel group and
  // on_block_done(l) fires as block l's gradients become final (L-1 .. 0; -1 = embeddings).
  void backward(Context& ctx, bool last_micro_step,
                const std::function<void(int)>& on_block_done = {});
  // Logits of the last position of sequence 0 (true vocabulary only), for sampling (tp = 1).
  std::vector<float> last_logits(Context& ctx);

 private:
  // l in block_* is the position of the block within this chunk.
  void embedding_forward(Context& ctx);
  void block_forward(Context& ctx, int l, const float* x);
  void head_forward(Context& ctx, const float* x);
  void block_backward(Context& ctx, int l, const float* x);
  void head_backward(Context& ctx, bool reduce);
  // Sequence parallelism leaves partial gradients in parameters replicated across the group.
  void reduce_replicated(std::initializer_list<std::pair<float*, int64_t>> grads);

  ModelConfig cfg_;
  StageSpec chunk_;
  TensorParallel& tp_;
  int64_t C_, Cl_, Hl_, vocab_start_, vocab_rows_, vocab_valid_;  // l = this rank's slice
  const float *wte_ = nullptr, *wpe_ = nullptr, *lnf_w_ = nullptr, *lnf_b_ = nullptr;
  float *dwte_ = nullptr, *dwpe_ = nullptr, *dlnf_w_ = nullptr, *dlnf_b_ = nullptr;
  std::vector<BlockParams> blocks_;
  std::vector<BlockGrads> dblocks_;
  // Scratch shared by all micro-batches (one forward or backward runs at a time).
  std::vector<float> full_, dres_, dln_, dfull_, dqkv_, datt_, dfc_, dgelu_;
};

// Training FLOPs per token (forward + backward): 6 * params + attention's 12 * L * C * T.
double flops_per_token(const ModelConfig& cfg, int64_t n_params, int64_t T);

}  // namespace trellis
