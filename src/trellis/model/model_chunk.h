#pragma once
// ModelChunk: the Transformer blocks one pipeline chunk holds (all of them on one stage), composed
// from the config: token (and learned position) embedding on the first chunk, blocks of
// norm -> self-attention (MHA/GQA, causal or bidirectional, optional RoPE) -> [norm ->
// cross-attention over the encoder's output] -> norm -> MLP (GELU/SwiGLU) with residuals, and a
// final norm with a (tied or untied) vocabulary head on the last chunk. An encoder-decoder is one
// list of blocks: the encoder's, then at the first decoder block the encoder's final norm and the
// decoder's embedding, then the decoder's blocks.
// Parameters and gradients are views into flat buffers (this rank's tensor-parallel slices); the
// activations of one micro-batch live in a Context. Tensor parallelism enters only through the
// TensorParallel operators around each column -> row-parallel pair; the model itself holds no
// communication.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/tensor.h"
#include "trellis/kernels/backend.h"
#include "trellis/model/block_hooks.h"
#include "trellis/model/config.h"
#include "trellis/model/kv_cache.h"
#include "trellis/model/modules.h"
#include "trellis/model/params.h"
#include "trellis/model/subword_ngrams.h"
#include "trellis/tensor_parallel/operators.h"

namespace trellis {

// What a training forward keeps for its backward (`--recompute`), a policy of each Context:
//   None       everything a block's backward reads.
//   Selective  not the MLP's up-projection output and activation (the GELU/SwiGLU input and
//              output): backward recomputes them from the kept norm output. Attention keeps its
//              O(T) logsumexp, so it is not rerun (Korthikanti et al. 2022 recompute attention's
//              T x T part, which the tiled kernel never stores; their idea extended to the MLP).
//   Full       only each block's output (the next block's input) and what crosses blocks (the
//              chunk's input, an encoder-decoder's encoder output): each block's backward starts
//              by running its forward again, tensor-parallel collectives included.
// The recomputed values come from the same kernels on the same inputs, so a run is bitwise the
// same under every policy. Whatever a Context does not keep lives in the model's workspace,
// shared by all Contexts (one forward or backward runs at a time).
enum class Recompute : uint8_t { None, Selective, Full };
struct ActivationLayout;  // model/activation_memory.h
Recompute parse_recompute(const std::string& name);  // none | selective | full
const char* recompute_name(Recompute r);

// Everything one micro-batch's forward saves for its backward. "local" tensors hold this rank's
// rows (all rows unless sequence parallelism splits them); "full" ones all B*T rows.
struct Context {
  // Set before ModelChunk::prepare, which sizes the buffers for it. split_backward: backward runs
  // as backward_input then backward_weights (zb1), so the Context keeps the weight part's output
  // gradients too.
  Recompute recompute = Recompute::None;
  bool split_backward = false;
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;  // [B*T]
  // An encoder-decoder's source tokens [B*T] (empty: the encoder reads `tokens` too).
  std::vector<int32_t> src_tokens;
  // Sequences padded to T: the real positions of each (of the source, for an encoder-decoder)
  // [B]; empty = all T. Padding is masked out of attention and pooling; its targets are -1.
  std::vector<int32_t> lengths;
  // Packed documents (--document-mask): where the document of each position starts in its row
  // [B*T] (non-decreasing along a row, 0 at its first position); empty = one sequence per row.
  // Attention stays inside a document (a block-diagonal causal mask) and positions (learned or
  // RoPE) restart at each document's start; forward derives `positions` [B*T] from it.
  std::vector<int32_t> doc_start, positions;
  std::vector<int32_t> labels;  // a classifier's class of each sequence [B] (-1: not counted)
  std::vector<float> features;  // feature inputs [B*T, input_features] (instead of tokens)
  // Dropout (DESIGN invariant 6): the trainer sets this per micro-batch of a training step; the
  // masks are a function of (seed, step, layer, site) and each element's global (sequence, first
  // + row b; position; element), never of the rank (ops::Dropout, docs/training.md). train false
  // (evaluation, sampling, decoding, the default): no masks.
  struct DropoutDraw {
    bool train = false;
    uint64_t seed = 0;
    int64_t step = 0;   // the global step (0-based, as Batches::fill)
    int64_t first = 0;  // global index in the step's batch of this micro-batch's sequence 0
  } dropout;
  // Set by forward: this pass draws masks (dropout.train, grad_scale != 0 and some p > 0); its
  // backward and any recompute draw the same ones.
  bool dropping = false;
  Tensor embedded;  // [local, C] input of block 0
  struct BlockActs {
    Tensor ln1, ln1_mean, ln1_rstd, ln1_full, qkv, lse, att, res_mid;
    // cross-attention (decoder blocks of an encoder-decoder)
    Tensor lnx, lnx_mean, lnx_rstd, lnx_full, xq, enc_full, xkv, xlse, xatt, res_x;
    Tensor ln2, ln2_mean, ln2_rstd, ln2_full, up, act, res_out;
    // A split backward's output gradients of the output projections (for backward_weights).
    Tensor dproj, ddown, dxproj;
    // ... and of the MLP's up projection and of q|k|v, where those are kept in bf16 (fp32 ones
    // hold their own gradient).
    Tensor dup, dqkv;
  };
  std::vector<BlockActs> blocks;
  // At the first decoder block: the encoder's output (its final norm) and the decoder's input.
  Tensor enc, enc_mean, enc_rstd, dec_embedded;
  // The head's logits [B*T, vocab rows]; a training forward fuses the loss's gradient into
  // them, so after it they hold dlogits. bf16 in a bf16 model (autocast's head output).
  Tensor lnf, lnf_mean, lnf_rstd, lnf_full, logits_or_grad, losses;
  // A classifier's pooled final states [B, C], class logits [B, K] (dlogits after a training
  // forward, as above) and predicted classes [B].
  Tensor pooled, class_logits_or_grad;
  std::vector<int32_t> predictions;
  // Pipeline stages after the first: the activation received from the previous stage, and the
  // gradient of it that backward produces; stages before the last: the received output gradient.
  // Between decoder stages these carry the encoder's output as well: [hidden rows; encoder rows].
  Tensor input, dinput, doutput, carry;

  // Bytes of the activation tensors this Context owns (model/activation_memory predicts them; the
  // input vectors above — tokens, targets, lengths, labels, features — are not counted).
  int64_t activation_bytes() const;
};

class ModelChunk {
 public:
  // params/grads: flat buffers laid out by `layout` (grads may be null for inference). tp: the
  // tensor-parallel group (size 1 for a single rank); it must outlive the model. chunk: the part
  // of layout's stage this object runs (a pipeline model chunk; default: all of it).
  // compute: the GEMM precision (BF16: bf16 operands, fp32 accumulation; see backend()).
  ModelChunk(const ParamLayout& layout, float* params, float* grads, TensorParallel& tp,
              const StageSpec* chunk = nullptr, DType compute = DType::F32);

  const ModelConfig& config() const { return cfg_; }
  // Sizes ctx's buffers for micro-batches of B sequences of T tokens: allocates
  // activation_layout(config, chunk, B, T, tp, sequence parallel) (model/activation_memory).
  void prepare(Context& ctx, int64_t B, int64_t T);
  // ... as `layout` says: that one, or in tests a changed one, to show that what the model
  // allocates follows the table the predictions sum.
  void prepare(Context& ctx, const ActivationLayout& layout);

  // Forward over ctx.tokens (or ctx.features, or ctx.input after the first stage) and, on the
  // last stage, ctx.targets (a classifier: ctx.labels): returns the summed loss of all B*T
  // targets (0 before the last stage); a classifier writes sequence b's loss at losses[b*T] and
  // zeros elsewhere, so the first rows*T losses are those of the first rows sequences. When
  // grad_scale != 0 the head already turns logits into dlogits (grad_scale = 1/global targets).
  double forward(Context& ctx, float grad_scale);
  // The activation a stage hands to the next one ([local rows, C], and the encoder's output after
  // it once the decoder has started).
  Tensor& output(Context& ctx) const;
  // Backward of the micro-batch in ctx (after forward with grad_scale != 0; before the last stage
  // from ctx.doutput, after the first stage leaving d(input) in ctx.dinput); accumulates into the
  // gradient buffer. On the last micro-step, on_block_done(l) fires as block l's gradients become
  // final (last .. first; -1 = embeddings). Under sequence parallelism the gradients of replicated
  // parameters are this rank's rows' share (reduce_replicated_grads sums them).
  void backward(Context& ctx, bool last_micro_step,
                const std::function<void(int)>& on_block_done = {});
  // The same backward in two parts (zero-bubble schedules; ctx prepared with split_backward and
  // no recompute). backward_input does all but the weight GEMMs: d(input) into ctx.dinput, the
  // norms', biases' and embeddings' gradients, and keeps each linear layer's output gradient in
  // ctx (over activations it has read by then) — hooks: before_backward as backward does,
  // after_input_backward where backward calls after_backward. backward_weights then accumulates
  // the weight GEMMs from those and the kept inputs, calling after_backward (and on the last
  // micro-step on_block_done) as each block's gradients are complete for this micro-batch. The
  // gradients equal backward's bit for bit. Neither part communicates but through the
  // tensor-parallel operators of backward_input.
  void backward_input(Context& ctx);
  void backward_weights(Context& ctx, bool last_micro_step,
                        const std::function<void(int)>& on_block_done = {});
  // Vocabulary logits (true vocabulary only) at rows b*T + t of the batch, [rows.size(), vocab],
  // for sampling and decoding (the whole model on one rank).
  std::vector<float> logits_at(Context& ctx, const std::vector<int64_t>& rows);
  // Incremental decoding with a key/value cache (the whole language model on one rank, no
  // dropout; model/kv_cache.h). start_cache: `rows` empty sequences of up to `capacity`
  // positions (at most the context). An encoder-decoder starts from encode instead: the encoder
  // runs once over the sources (each without its end token, which encode appends as the
  // padded forward does) and each decoder block's cross-attention keys and values are kept, one
  // row per source.
  KVCache start_cache(int64_t rows, int64_t capacity) const;
  KVCache encode(const std::vector<std::span<const uint32_t>>& sources, int64_t capacity,
                 int32_t end_token);
  // Appends tokens[r] (one or more) to row r at its next positions and returns the vocabulary
  // logits [rows, vocab] of each row's last new position: the logits a full forward over the
  // row's whole sequence gives there, up to float summation order.
  const std::vector<float>& decode(KVCache& cache,
                                   const std::vector<std::span<const int32_t>>& tokens);
  // The subword n-grams of a model with subword_ngrams > 0 (built from its tokenizer by
  // data/subword_ngrams_for); it must outlive the model. Such a model refuses to run without.
  void set_subword_ngrams(const SubwordNgrams* ngrams) { subword_ = ngrams; }
  // A bf16 model's copies of its weights in bf16 (model/modules.h WeightCopies): how long they
  // live. PerPass (the default): until the next forward, logits_at, encode or decode starts, so
  // a caller that writes the weights between passes needs to say nothing. UntilChanged: until
  // weights_changed(), which the caller must call whenever the fp32 weights may have changed
  // (the trainer: before each step's passes and each evaluation). Off: none are kept; each GEMM
  // rounds the fp32 weights it reads (ZeRO-3, whose rank holds a block only while it runs).
  // An fp32 model has none.
  enum class WeightCopyPolicy : uint8_t { PerPass, UntilChanged, Off };
  void set_weight_copies(WeightCopyPolicy policy);
  void weights_changed() { copies_.changed(); }
  // A mixed-precision run's bf16 working weights (parallel/working_weights.h): bits laid out as
  // the fp32 buffer `params` this chunk was built over, which the caller keeps current. The
  // GEMMs (and bf16_embeddings' lookups) read them instead of copies of their own (the fp32
  // values of what they read may then be absent); replaces any WeightCopyPolicy. A bf16 chunk
  // only.
  void use_working_weights(const float* params, const uint16_t* bits);
  // Bytes of the bf16 weight copies held once made (0 for fp32 or with Off);
  // weight_copy_bytes (model/activation_memory.h) predicts them.
  int64_t weight_copy_bytes() const;
  // Adds hooks run around every block of every micro-batch from now on, after those added
  // before; they must outlive the model.
  void add_block_hooks(BlockHooks& hooks) { hooks_.push_back(&hooks); }
  // Label smoothing e in [0, 1) of the loss (PyTorch's CrossEntropyLoss(label_smoothing = e)
  // over the true vocabulary, or the classes), applied in training forwards only
  // (grad_scale != 0): an evaluation forward reports the plain negative log-likelihood.
  void set_label_smoothing(float e);
  // Bytes of the scratch the model shares between its Contexts: backward's gradient buffers and
  // what recomputing Contexts do not keep (one block's worth); allocated by prepare and held.
  int64_t workspace_bytes() const;

 private:
  struct Block {
    int layer;
    bool decoder;  // cross-attends to the encoder's output
    Norm ln1, lnx, ln2;
    Linear qkv, proj, xq, xkv, xproj, up, down;  // up/down empty: no MLP
  };
  // l in block_* is the position of the block within this chunk.
  // out = token embedding of `tokens` (+ learned positions: an encoder-decoder's decoder table
  // when `decoder`, else the model's), this rank's rows.
  void embed(const int32_t* tokens, bool decoder, float* out, const Context& ctx);
  // The lookups (of bf16 copies with bf16_embeddings): out[n, C] = the tokens' rows of this
  // rank's vocabulary slice (zero for other tokens); out += the position rows of rows row0..
  // (position (row0 + i) % T, or as `positions` says) from the table `embed` would use (none
  // under RoPE).
  void lookup_tokens(float* out, const int32_t* tokens, int64_t n);
  void add_positions(float* out, bool decoder, int64_t row0, int64_t rows, int64_t T,
                     const int32_t* positions);
  void embed_backward(const int32_t* tokens, float* dpos, const Context& ctx);
  // out[b*T + t] += the mean of the n-gram rows of token t's bag (forward), and its backward
  // from d(out) into the n-gram table's gradient.
  void ngrams_forward(const int32_t* tokens, float* out, const Context& ctx);
  void ngrams_backward(const int32_t* tokens, const float* dout, const Context& ctx) const;
  void decoder_start_forward(Context& ctx, const float* x_enc);
  void cross_forward(Context& ctx, int l, Context::BlockActs& a);
  void cross_backward(Context& ctx, int l, Context::BlockActs& a);
  // Block l's activations as its forward and backward see them: ctx's own, or under a recompute
  // policy a view mixing what ctx keeps with the workspace (work_) for the rest.
  // `view` holds the mix (a local of the caller, so it shares no storage once the call is done).
  Context::BlockActs& acts(Context& ctx, int l, Context::BlockActs& view);
  // The attention output and logsumexp from a.qkv (self) or a.xq and a.xkv (cross).
  void self_attention(const Context& ctx, const Block& p, Context::BlockActs& a);
  void cross_attention(const Context& ctx, const Block& p, Context::BlockActs& a);
  ops::AttentionShape cross_attention_shape(const Context& ctx, const Block& p) const;
  // The MLP's up projection and activation (a.up, a.act) from its input (the norm's output), in
  // the dtype a keeps them in; mlp_activation: the same in fp32 buffers (decoding's too).
  void mlp_forward(const Block& p, Context::BlockActs& a, Rows in, int64_t rows);
  void mlp_activation(const Block& p, float* up, float* act, Rows in, int64_t rows) const;
  // Where a split backward keeps a column-parallel layer's output gradient for backward_weights:
  // the output's own tensor, or `own` when the output is kept in bf16.
  static Tensor& kept_grad(Tensor& output, Tensor& own);
  // Where a kernel writes a value the Context keeps as `kept`: kept itself, or (kept in bf16)
  // fp32 `staging` that keep() then rounds into kept.
  static float* staged(Tensor& kept, Tensor& staging);
  void keep(Tensor& kept, const float* staged, int64_t n) const;
  // A column-parallel layer's input from a norm's output kept in `local`: gathered into `full`
  // under sequence parallelism (in fp32), else local itself (fp32 or bf16). saved_input: the
  // same in backward, from what forward kept.
  Rows enter(Tensor& local, Tensor& full, int64_t rows);
  Rows saved_input(const Tensor& local, const Tensor& full) const;
  // One block of decode over the new positions in cache.work.x (into cache.work.y); li: the
  // block's index among the decoder blocks.
  void block_decode(KVCache& cache, const Block& p, int64_t li) const;
  // The encoder's output as this chunk sees it ([local rows, C]).
  const float* encoder_output(Context& ctx) const;
  void blocks_forward(Context& ctx);
  // recompute: a full-recompute backward's rerun, which stops at the MLP's activation (backward
  // needs nothing after it, and the block's output is kept).
  void block_forward(Context& ctx, int l, const float* x, bool recompute = false);
  void head_forward(Context& ctx, const float* x);
  void block_backward(Context& ctx, int l, const float* x);
  void mlp_backward(Context& ctx, int l, Context::BlockActs& a);
  // The weight GEMMs of block l that backward_input deferred.
  void block_weights(Context& ctx, int l);
  // A linear layer's backward inside backward (whole) or backward_input (split_: dx only, its
  // output gradient dy copied into `keep` unless it is there already).
  void linear_backward(const Linear& lin, float* dx, const float* dy, Rows x, int64_t rows,
                       bool bias_grad, Tensor& keep) const;
  // backward (split false; notify: on_block_done on the last micro-step, else null) or
  // backward_input (split true).
  void backward_pass(Context& ctx, bool split, const std::function<void(int)>* notify);
  // The head's weight gradient (this rank's vocabulary rows) from ctx's dlogits (dlogits16: their
  // bf16 rounding, when made already).
  void head_weights(Context& ctx, const uint16_t* dlogits16 = nullptr);
  // A bf16 model's logits as its head keeps them (rounded to bf16, held as floats) for the
  // callers outside training (logits_at, decode), so they see what the loss sees; fp32 ones stay.
  void as_head_output(std::vector<float>& logits) const;
  // Whether a split backward defers the head's weight gradient: not in a chunk that also embeds
  // (a tied head shares its gradient with the embedding, which backward_input writes, so the
  // sums keep backward's order: head, then embedding, micro-batch after micro-batch).
  bool defers_head() const { return !chunk_.embedding && !decoder_start_; }
  // The input of block i of the chunk.
  const float* block_input(Context& ctx, int i) const;
  void head_backward(Context& ctx);
  double classifier_forward(Context& ctx, float grad_scale);
  void classifier_backward(Context& ctx);
  // Dropout of `site` in global layer `layer` with probability p for this pass (p = 0 when ctx
  // does not draw masks): a kernel's Dropout.
  ops::Dropout dropout_of(const Context& ctx, float p, int layer, int site) const;
  // The residual-branch / embedding dropout of this rank's rows (in place; out = in allowed).
  void drop_rows(const Context& ctx, float* out, const float* in, const float* residual,
                 const ops::Dropout& d) const;
  // A residual branch's end: out = x + drop(out + bias) (this rank's rows).
  void add_branch(const Context& ctx, float* out, const float* bias, const float* x, int layer,
                  int site) const;
  // d(branch) from d(branch output) dres: dres itself, or its dropped copy in scratch.
  float* branch_grad(const Context& ctx, float* dres, float* scratch, int layer, int site) const;
  // The weight of row t of sequence b in its pooled vector.
  float pool_weight(const Context& ctx, int64_t b, int64_t t) const;
  // Valid positions of sequence b.
  int64_t length(const Context& ctx, int64_t b) const;
  ops::AttentionShape attention_shape(const Context& ctx, const Block& b) const;
  // ctx.positions from ctx.doc_start (cleared without documents).
  void set_doc_positions(Context& ctx) const;

  // The head's weight [vocab rows, C] as a GEMM operand (its bf16 copy in a bf16 model).
  ops::GemmOperand head_weight();
  // Starts a pass (forward, logits_at, encode, decode): under PerPass the copies are stale.
  void start_pass();

  const Backend& k_;
  const bool bf16_;  // compute precision BF16
  WeightCopies copies_;
  WeightCopyPolicy copy_policy_ = WeightCopyPolicy::PerPass;
  int head_copy_ = -1;
  // With bf16_embeddings, the tables' copies (-1: not looked up here, or read in fp32).
  int emb_copy_ = -1, pos_copy_ = -1, dec_pos_copy_ = -1, ngram_copy_ = -1;
  ModelConfig cfg_;
  StageSpec chunk_;
  TensorParallel& tp_;
  int64_t C_, Hl_, Hkvl_, hd_, Fl_;  // l = this rank's slice
  int64_t vocab_start_, vocab_rows_, vocab_valid_;
  const float *emb_ = nullptr, *pos_ = nullptr, *head_w_ = nullptr, *dec_pos_ = nullptr;
  float *demb_ = nullptr, *dpos_ = nullptr, *dhead_w_ = nullptr, *ddec_pos_ = nullptr;
  const float* ngram_w_ = nullptr;  // embed_ngrams.weight (subword_ngrams > 0)
  float* dngram_w_ = nullptr;
  const SubwordNgrams* subword_ = nullptr;
  Norm lnf_, enc_norm_;
  Linear features_, classifier_;  // feature inputs' projection; a classifier's head
  // Encoder-decoder: the chunk receives / sends the encoder's output along with its activation.
  bool carry_in_ = false, carry_out_ = false, decoder_start_ = false, has_decoder_ = false;
  std::vector<Block> blocks_;
  std::vector<BlockHooks*> hooks_;  // called in the order added
  bool split_ = false;              // inside backward_input: linear layers defer their weights
  void run_hooks(void (BlockHooks::*hook)(int), int layer) {
    for (BlockHooks* h : hooks_) (h->*hook)(layer);
  }
  float label_smoothing_ = 0.0f;
  // Scratch shared by all micro-batches (one forward or backward runs at a time).
  Tensor full_, dres_, dln_, dfull_, dqkv_, datt_, dup_, dact_;
  Tensor denc_, denc_full_, dxq_, dxkv_;  // cross-attention
  // What recomputing Contexts do not keep (one block's worth; see acts()).
  Context::BlockActs work_;
};

// The bytes of the bf16 weight copies a bf16 ModelChunk of `chunk` keeps (its linear layers' and
// head's weights, with bf16_embeddings the tables it looks up; ModelChunk::weight_copy_bytes,
// which test_activation_memory checks against it).
int64_t weight_copy_bytes(const ParamLayout& layout, const StageSpec& chunk);
// The policy a bf16 training run gives its chunks: UntilChanged, or Off under ZeRO-3 (whose
// ranks hold a block's weights only while it runs).
ModelChunk::WeightCopyPolicy training_weight_copies(int zero);
// Whether a bf16 model reads tensor s only in bf16: a linear layer's or an untied head's weight
// (not a bias), read as a bf16 GEMM operand, and with cfg.bf16_embeddings the lookup tables too.
// The rest (norms, biases, and without the key the tables, a tied head's token embedding
// included, which its lookup reads) the kernels read in fp32.
bool read_as_bf16_only(const ParamSpec& s, const ModelConfig& cfg);
// The ranges of the layout's buffer that a bf16 model reads in fp32 (every tensor but the
// read_as_bf16_only ones), sorted and merged: what a mixed-precision run keeps replicated in fp32.
std::vector<FlatRange> fp32_read_ranges(const ParamLayout& layout);

// Training FLOPs per token (forward + backward): 6 * params + attention's 12 * L * C * T.
double flops_per_token(const ModelConfig& cfg, int64_t n_params, int64_t T);

}  // namespace trellis
