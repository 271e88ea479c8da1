#pragma once
// GPT-2 as three modules (Embedding, Block, Head) with explicit forward/backward. Parameters and
// gradients are views into flat buffers; activations of one micro-batch live in a Context.
#include <cstdint>
#include <functional>
#include <vector>

#include "trellis/model/config.h"
#include "trellis/model/params.h"

namespace trellis {

// Everything one micro-batch's forward saves for its backward.
struct Context {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;  // [B*T]
  std::vector<float> embedded;           // [BT,C] input of block 0
  struct BlockActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, probs, att, res_mid;
    std::vector<float> ln2, ln2_mean, ln2_rstd, fc, gelu, res_out;
  };
  std::vector<BlockActs> blocks;
  std::vector<float> lnf, lnf_mean, lnf_rstd, logits, losses;

  void resize(const ModelConfig& cfg, int64_t B, int64_t T);
};

// Gradient scratch shared by all micro-batches (backward runs one at a time).
struct BackwardScratch {
  std::vector<float> dres, dln, dqkv, datt, dfc, dgelu;
  void resize(const ModelConfig& cfg, int64_t BT);
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
  // params/grads: flat buffers laid out by `layout` (grads may be null for inference).
  GPT(const ModelConfig& cfg, const ParamLayout& layout, float* params, float* grads);

  const ModelConfig& config() const { return cfg_; }

  // Forward over ctx.tokens. With targets, returns the summed loss; when grad_scale != 0 the head
  // already turns logits into dlogits (scaled by grad_scale = 1/global token count).
  double forward(Context& ctx, float grad_scale);
  // Backward of the micro-batch in ctx (after forward with grad_scale != 0); accumulates into the
  // gradient buffer. on_block_done(l) fires once block l's parameter gradients are complete for
  // this micro-batch (blocks finish in order L-1..0; -1 means embeddings done).
  void backward(Context& ctx, const std::function<void(int)>& on_block_done = {});
  // Logits of the last position of sequence 0 (true vocabulary only), for sampling.
  std::vector<float> last_logits(Context& ctx);

 private:
  void embedding_forward(Context& ctx);
  void block_forward(Context& ctx, int l, const float* x);
  void head_forward(Context& ctx, const float* x);
  void block_backward(Context& ctx, int l, const float* x);

  ModelConfig cfg_;
  const float* wte_;
  const float* wpe_;
  const float *lnf_w_, *lnf_b_;
  float *dwte_ = nullptr, *dwpe_ = nullptr, *dlnf_w_ = nullptr, *dlnf_b_ = nullptr;
  std::vector<BlockParams> blocks_;
  std::vector<BlockGrads> dblocks_;
  BackwardScratch scratch_;
};

// Training FLOPs per token (forward + backward): 6 * params + attention's 12 * L * C * T.
double flops_per_token(const ModelConfig& cfg, int64_t n_params, int64_t T);

}  // namespace trellis
