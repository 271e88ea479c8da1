// model/activation_memory: the analytic activation bytes equal what the model allocates, for every
// family, pipeline chunk kind, tensor-parallel slice and recompute policy; and how the model
// relates to Korthikanti et al. 2022's per-layer formula, term by term.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/model/activation_memory.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/model_chunk.h"
#include "trellis/tensor_parallel/operators.h"

namespace trellis {
namespace {

// Rank 0 of a tensor-parallel pair whose partner mirrors it: an all-gather copies this rank's
// rows into every slot, a reduce-scatter keeps this rank's slice, an all-reduce leaves the
// buffer as it is. The values mean nothing; the shapes and allocations are a tp = 2 rank's.
class MirrorComm final : public Communicator {
 public:
  class Done final : public Work {
   public:
    void wait() override {}
    bool test() override { return true; }
  };
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int world_rank() const override { return 0; }
  std::string backend() const override { return "mirror"; }
  std::unique_ptr<Work> all_reduce_async(float*, size_t) override { return done(); }
  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             size_t count) override {
    std::copy_n(send, count, recv);
    return done();
  }
  std::unique_ptr<Work> all_gather_async(const float* send, float* recv, size_t count) override {
    std::copy_n(send, count, recv);
    std::copy_n(send, count, recv + count);
    return done();
  }
  std::unique_ptr<Work> broadcast_async(float*, size_t, int) override { return done(); }
  std::unique_ptr<Work> send_async(const float*, size_t, int, int) override { return done(); }
  std::unique_ptr<Work> recv_async(float*, size_t, int, int) override { return done(); }
  void all_reduce_sum(double*, size_t) override {}
  void all_reduce_max(double*, size_t) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  [[noreturn]] void abort(const std::string& msg, int) override { throw std::runtime_error(msg); }

 private:
  static std::unique_ptr<Work> done() { return std::make_unique<Done>(); }
};

struct Case {
  std::string name;
  ModelConfig cfg;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](const std::string& name, ModelConfig c) {
    c.vocab_size = 70;  // padded to 128 rows (64 per rank at tp = 2)
    c.validate();
    out.push_back({name, c});
  };
  add("gpt2", model_preset("tiny"));              // LayerNorm, GELU with fused bias, tied head
  add("llama", model_preset("llama-tiny"));       // RMSNorm, RoPE, GQA, SwiGLU, untied head
  ModelConfig cls = model_preset("encoder-tiny");  // bidirectional encoder classifier
  cls.num_classes = 3;
  add("encoder_cls", cls);
  ModelConfig attn_only = model_preset("encoder-tiny");
  attn_only.mlp = MlpKind::None;
  add("encoder_no_mlp", attn_only);
  add("encdec", model_preset("encdec-tiny"));  // blocks 0-1 encoder, 2-3 decoder
  return out;
}

// The chunks a pipeline may give a rank: the whole model, a first and a last stage, and for the
// encoder-decoder the stage where the decoder starts, one after it, and one passing the
// encoder's output on.
std::vector<StageSpec> chunks(const ModelConfig& cfg) {
  std::vector<StageSpec> out = {StageSpec::whole(cfg)};
  const int n = cfg.total_layers();
  StageSpec first, last;
  for (int l = 0; l < n; ++l) (l < n / 2 ? first : last).layers.push_back(l);
  first.head = false, last.embedding = false;
  out.push_back(first), out.push_back(last);
  if (cfg.encoder_decoder()) {
    out.push_back({{1, 2}, false, false});  // decoder start inside, carries out
    out.push_back({{3}, false, true});      // carries in, ends with the head
    out.push_back({{2}, false, false});     // starts the decoder, passes the encoder's output on
  }
  return out;
}

// Fills what a forward reads (tokens, targets, labels, a previous stage's input, a next stage's
// gradient) with valid values.
void fill_inputs(const ModelConfig& cfg, Context& ctx) {
  for (size_t i = 0; i < ctx.tokens.size(); ++i) {
    ctx.tokens[i] = int32_t(i * 7 % size_t(cfg.vocab_size));
    ctx.targets[i] = int32_t(i * 3 % size_t(cfg.vocab_size));
  }
  if (cfg.num_classes > 0) ctx.labels.assign(size_t(ctx.B), 1);
  for (Tensor* t : {&ctx.input, &ctx.doutput})
    for (int64_t i = 0; i < t->numel(); ++i) t->f32()[i] = 0.01f * float(i % 13);
}

TEST(ActivationMemory, EqualsWhatTheModelAllocates) {
  const int64_t B = 2, T = 8;
  MirrorComm mirror;
  int checked = 0;
  for (const Case& c : cases()) {
    for (const StageSpec& chunk : chunks(c.cfg)) {
      for (int tp : {1, 2}) {
        for (bool sp : {false, true}) {
          if (sp && (tp == 1 || !c.cfg.lm_head())) continue;  // classifiers refuse SP
          for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
            SCOPED_TRACE(c.name + " layers " + std::to_string(chunk.layers.front()) + ".." +
                         std::to_string(chunk.layers.back()) + " emb " +
                         std::to_string(chunk.embedding) + " head " + std::to_string(chunk.head) +
                         " tp " + std::to_string(tp) + (sp ? " sp" : "") + " " +
                         recompute_name(rc));
            const ParamLayout layout(c.cfg, tp, 0, &chunk);
            std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
            init_params(layout, 5, params.data());
            TensorParallel group(tp == 1 ? nullptr : &mirror, sp);
            ModelChunk model(layout, params.data(), grads.data(), group, &chunk);
            Context ctx;
            ctx.recompute = rc;
            model.prepare(ctx, B, T);
            fill_inputs(c.cfg, ctx);
            const ActivationMemory want =
                activation_memory(c.cfg, chunk, B, T, tp, sp, rc, DType::F32);
            model.forward(ctx, 1.0f / float(B * T));
            EXPECT_EQ(ctx.activation_bytes(), want.context);
            int64_t blocks = 0;
            for (int l : chunk.layers)
              blocks += block_activation_bytes(c.cfg, c.cfg.encoder_decoder() && l >= c.cfg.n_layer,
                                               B, T, tp, sp, rc);
            EXPECT_EQ(blocks, want.blocks);
            model.backward(ctx, true);
            EXPECT_EQ(ctx.activation_bytes(), want.context);  // backward allocates nothing
            EXPECT_EQ(model.workspace_bytes(), want.workspace);
            // bf16 keeps the saved inputs of linear layers in bf16: as predicted, and less.
            ModelChunk model16(layout, params.data(), grads.data(), group, &chunk, DType::BF16);
            Context ctx16;
            ctx16.recompute = rc;
            model16.prepare(ctx16, B, T);
            fill_inputs(c.cfg, ctx16);
            const ActivationMemory want16 =
                activation_memory(c.cfg, chunk, B, T, tp, sp, rc, DType::BF16);
            model16.forward(ctx16, 1.0f / float(B * T));
            model16.backward(ctx16, true);
            EXPECT_EQ(ctx16.activation_bytes(), want16.context);
            EXPECT_EQ(model16.workspace_bytes(), want16.workspace);
            // (with sequence parallelism and no MLP no saved input is a bf16 one)
            if (rc == Recompute::None && (!sp || c.cfg.mlp != MlpKind::None))
              EXPECT_LT(want16.context, want.context);
            EXPECT_LE(want16.context, want.context);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// One place for each size: a change to one block's activation layout reaches both what the model
// allocates and what the prediction sums, with no second edit. Block 1 here saves its attention's
// residual sum twice as wide (as a block that kept a second tensor would); a prediction that
// restated the sizes instead of summing the table would miss it, and so would a model that sized
// its Context on its own.
// zb1's split backward (backward_input, then backward_weights) gives bitwise the gradients and
// d(input) of the whole backward, on every model family, chunk, tp and sequence parallelism;
// its Context holds what activation_memory predicts with split_backward; and the hooks see
// after_backward only once the weight part is done.
TEST(ActivationMemory, SplitBackwardEqualsBackwardBitwiseAndIsPredicted) {
  const int64_t B = 2, T = 8;
  MirrorComm mirror;
  struct HookLog final : BlockHooks {
    std::vector<std::string> events;
    void after_input_backward(int l) override { events.push_back("B" + std::to_string(l)); }
    void after_backward(int l) override { events.push_back("W" + std::to_string(l)); }
  };
  int checked = 0;
  // bf16: a split Context keeps the output gradients of q|k|v and the up projection apart
  // (dqkv, dup), as those outputs are kept in bf16.
  for (DType compute : {DType::F32, DType::BF16})
  for (const Case& c : cases())
    for (const StageSpec& chunk : chunks(c.cfg))
      for (int tp : {1, 2})
        for (bool sp : {false, true}) {
          if (sp && (tp == 1 || !c.cfg.lm_head())) continue;
          SCOPED_TRACE(c.name + " layers " + std::to_string(chunk.layers.front()) + ".." +
                       std::to_string(chunk.layers.back()) + " tp " + std::to_string(tp) +
                       (sp ? " sp" : "") + (compute == DType::BF16 ? " bf16" : ""));
          const ParamLayout layout(c.cfg, tp, 0, &chunk);
          std::vector<float> params(layout.size());
          init_params(layout, 5, params.data());
          TensorParallel group(tp == 1 ? nullptr : &mirror, sp);
          std::vector<std::vector<float>> grads(2, std::vector<float>(layout.size(), 0.0f));
          std::vector<std::vector<float>> dinput(2);
          HookLog log;
          for (int split = 0; split < 2; ++split) {
            ModelChunk model(layout, params.data(), grads[size_t(split)].data(), group, &chunk,
                             compute);
            if (split) model.add_block_hooks(log);
            Context ctx;
            ctx.split_backward = split == 1;
            model.prepare(ctx, B, T);
            fill_inputs(c.cfg, ctx);
            EXPECT_EQ(ctx.activation_bytes(),
                      activation_memory(c.cfg, chunk, B, T, tp, sp, Recompute::None, compute,
                                        split == 1)
                          .context);
            for (int micro = 0; micro < 2; ++micro) {  // gradients accumulate over two
              model.forward(ctx, 1.0f / float(B * T));
              if (split) {
                model.backward_input(ctx);
                if (micro == 0) EXPECT_TRUE(log.events.empty() || log.events[0][0] == 'B');
                model.backward_weights(ctx, micro == 1);
              } else {
                model.backward(ctx, micro == 1);
              }
            }
            dinput[size_t(split)].assign(ctx.dinput.f32(), ctx.dinput.f32() + ctx.dinput.numel());
          }
          EXPECT_GT(layout.size(), 0u);
          EXPECT_TRUE(grads[0] == grads[1]) << "the split backward's gradients differ";
          EXPECT_TRUE(dinput[0] == dinput[1]) << "the split backward's d(input) differs";
          // Per micro-batch: every block's input part, then every block's weight part.
          const size_t per_micro = log.events.size() / 2;
          ASSERT_GT(per_micro, 0u);
          for (size_t i = 0; i < per_micro; ++i)
            EXPECT_EQ(log.events[i][0], i < per_micro / 2 ? 'B' : 'W') << i;
          ++checked;
        }
  EXPECT_GT(checked, 40);
}

TEST(ActivationMemory, AChangedBlockLayoutChangesTheModelAndThePredictionAlike) {
  ModelConfig cfg = model_preset("tiny");
  cfg.vocab_size = 70;
  cfg.validate();
  const StageSpec whole = StageSpec::whole(cfg);
  const int64_t B = 2, T = 8, wider = B * T * cfg.n_embd * int64_t(sizeof(float));
  const ParamLayout layout(cfg, 1, 0, &whole);
  std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
  init_params(layout, 5, params.data());
  TensorParallel group(nullptr, false);
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    SCOPED_TRACE(recompute_name(rc));
    ActivationLayout changed = activation_layout(cfg, whole, B, T, 1, false);
    const ActivationMemory before = activation_memory(changed, rc);
    int widened = 0;
    for (std::vector<BlockTensor>* block : {&changed.blocks[1], &changed.workspace_block})
      for (BlockTensor& t : *block)
        if (t.member == &Context::BlockActs::res_mid) t.shape[1] *= 2, ++widened;
    ASSERT_EQ(widened, 2);
    const ActivationMemory want = activation_memory(changed, rc);
    // The prediction followed: the residual sum is kept by the Context unless full recompute
    // rebuilds it in the workspace.
    if (rc == Recompute::Full) {
      EXPECT_EQ(want.context, before.context);
      EXPECT_EQ(want.workspace, before.workspace + wider);
    } else {
      EXPECT_EQ(want.context, before.context + wider);
      EXPECT_EQ(want.workspace, before.workspace);
    }
    // ... and so did the model, through a training step on the changed buffers.
    ModelChunk model(layout, params.data(), grads.data(), group, &whole);
    Context ctx;
    ctx.recompute = rc;
    model.prepare(ctx, changed);
    fill_inputs(cfg, ctx);
    EXPECT_EQ(ctx.blocks[1].res_mid.numel(), rc == Recompute::Full ? 0 : 2 * B * T * cfg.n_embd);
    model.forward(ctx, 1.0f / float(B * T));
    model.backward(ctx, true);
    EXPECT_EQ(ctx.activation_bytes(), want.context);
    EXPECT_EQ(model.workspace_bytes(), want.workspace);
  }
}

// Recomputing keeps less: full keeps only each block's output; selective keeps everything but
// the MLP's up projection and activation (attention's O(T) logsumexp stays: nothing reruns it).
TEST(ActivationMemory, RecomputeKeepsLessAndTheWorkspaceHoldsTheRest) {
  const ModelConfig cfg = [] {
    ModelConfig c = model_preset("gpt2");
    c.vocab_size = 50257;
    return c;
  }();
  const int64_t B = 4, T = 1024, C = cfg.n_embd, BT = B * T;
  const StageSpec whole = StageSpec::whole(cfg);
  const ActivationMemory none = activation_memory(cfg, whole, B, T, 1, false, Recompute::None);
  const ActivationMemory sel = activation_memory(cfg, whole, B, T, 1, false, Recompute::Selective);
  const ActivationMemory full = activation_memory(cfg, whole, B, T, 1, false, Recompute::Full);
  const int64_t L = cfg.n_layer, dropped_sel = 4 * (BT * 4 * C * 2);
  EXPECT_EQ(none.blocks - sel.blocks, L * dropped_sel);
  EXPECT_EQ(full.blocks, L * 4 * BT * C);
  EXPECT_EQ(sel.workspace - none.workspace, dropped_sel);
  EXPECT_EQ(none.context - none.blocks, full.context - full.blocks);  // outside blocks: the same
}

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
// Table 2: activation bytes per transformer layer with fp16 activations and 1-byte dropout masks,
// s = sequence, b = micro-batch, h = width, a = heads, t = tensor-parallel size. trellis on a
// Megatron-like block (LayerNorm, GELU, 4h MLP, biases) keeps the same tensors except:
//   - fp32, not fp16: every kept tensor counts 4 bytes per element, not 2;
//   - no dropout: no masks (sbh + sbh, and as^2b of attention's) and no dropout output (2as^2b);
//   - attention is the tiled kernel: no softmax output (2as^2b), its logsumexp instead (4asb/t);
//   - each LayerNorm keeps its mean and rstd (2 floats per row; 2 norms: 16sb bytes per layer,
//     /t under SP); the paper leaves these out;
//   - under sequence parallelism trellis keeps both norms' all-gathered outputs (the inputs of the
//     column-parallel GEMMs' weight gradients: 2 x 4sbh bytes, not /t) next to their local rows,
//     where Megatron keeps only the local rows and all-gathers again in backward;
//   - selective recompute here drops the MLP's up projection and GELU output (2 x 4h per row),
//     so it keeps 16 fewer fp16-equivalent bytes per sbh/t, and keeps the logsumexp (there is no
//     attention core to drop, and the O(s) logsumexp spares rerunning attention);
//   - full recompute keeps each block's output (the next block's input), 4sbh/t bytes under SP.
TEST(ActivationMemory, RelatesToMegatronsPerLayerFormulaTermByTerm) {
  ModelConfig cfg = model_preset("gpt2-medium");  // h 1024, a 16, LayerNorm, GELU, biases
  cfg.vocab_size = 50257;
  const int64_t s = 1024, b = 4, h = cfg.n_embd, a = cfg.n_head;
  ASSERT_EQ(cfg.ffn(), 4 * h);
  for (int64_t t : {1, 2, 4}) {
    SCOPED_TRACE("t = " + std::to_string(t));
    const int64_t sbh = s * b * h, as2b = a * s * s * b, sb = s * b, lse = 4 * a * s * b / t;
    // Megatron's formulas, in bytes (the paper's sbh(...) with the fractions multiplied out).
    const int64_t tp_only = sbh * 10 + sbh * 24 / t + 5 * as2b / t;  // t = 1: sbh(34 + 5as/h)
    const int64_t tp_sp = sbh * 34 / t + 5 * as2b / t;
    const int64_t tp_sp_selective = sbh * 34 / t;
    const int64_t full = 2 * sbh;
    auto trellis = [&](bool sp, Recompute rc) {
      return block_activation_bytes(cfg, false, b, s, int(t), sp, rc);
    };
    // Without SP: the 10sbh replicated = LN inputs 4 + LN outputs 4 + masks 2; 24/t the rest.
    EXPECT_EQ(trellis(false, Recompute::None),
              2 * (tp_only - 2 * sbh - 5 * as2b / t) + 16 * sb + lse);
    if (t == 1) {
      EXPECT_EQ(trellis(false, Recompute::None),
                2 * (sbh * 34 + 5 * as2b - 2 * sbh - 5 * as2b) + 16 * sb + lse);
      EXPECT_EQ(trellis(false, Recompute::Full), 2 * full);
      continue;  // sequence parallelism needs t > 1
    }
    EXPECT_EQ(trellis(true, Recompute::None),
              2 * (tp_sp - 2 * sbh / t - 5 * as2b / t) + 16 * sb / t + 8 * sbh + lse);
    EXPECT_EQ(trellis(true, Recompute::Selective),
              2 * (tp_sp_selective - 2 * sbh / t - 16 * sbh / t) + 16 * sb / t + 8 * sbh + lse);
    EXPECT_EQ(trellis(true, Recompute::Full), 2 * full / t);
    EXPECT_EQ(trellis(false, Recompute::Full), 2 * full);
  }
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// A bf16 model keeps the saved inputs of its linear layers (the norms' outputs) in bf16 with the
// results of keeping them in fp32 and rounding at each GEMM; and it keeps one bf16 copy of each
// weight it multiplies, as weight_copy_bytes predicts (every family and chunk kind; none for fp32
// or with copies off); the copies give the bits of rounding at each GEMM call (Off) over two steps
// of two micro-batches each, with the weights changed between them; and they are really read: a
// step whose weight change goes unannounced gives other losses. Each case again with
// bf16_embeddings: the lookup tables join the copies (under Off each lookup rounds its table) and a
// chunk that looks one up keeps more.
TEST(WeightCopies, PredictedAndBitwiseTheRoundingAtEachCall) {
  const int64_t B = 2, T = 8;
  int compared = 0;
  std::vector<Case> all = cases();
  for (Case c : cases()) {
    c.name += " bf16_embeddings";
    c.cfg.bf16_embeddings = true;
    all.push_back(c);
  }
  for (const Case& c : all) {
    for (const StageSpec& chunk : chunks(c.cfg)) {
      SCOPED_TRACE(c.name + " layers " + std::to_string(chunk.layers.front()) + ".." +
                   std::to_string(chunk.layers.back()));
      const ParamLayout layout(c.cfg, 1, 0, &chunk);
      TensorParallel group(nullptr, false);
      using P = ModelChunk::WeightCopyPolicy;
      // Two steps of two micro-batches; returns the losses and the final gradients.
      // f32_inputs: the Context keeps the norms' outputs in fp32 (as before bf16 storage; the
      // GEMM outputs and the MLP activation stay bf16, as element-wise kernels write them).
      auto run = [&](DType compute, P policy, bool announce, bool f32_inputs = false) {
        std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
        init_params(layout, 5, params.data());
        ModelChunk model(layout, params.data(), grads.data(), group, &chunk, compute);
        model.set_weight_copies(policy);
        std::vector<double> out;
        for (int step = 0; step < 2; ++step) {
          if (announce) model.weights_changed();
          std::fill(grads.begin(), grads.end(), 0.0f);
          for (int micro = 0; micro < 2; ++micro) {
            Context ctx;
            if (f32_inputs) {
              ActivationLayout L = activation_layout(c.cfg, chunk, B, T, 1, false, compute);
              using A = Context::BlockActs;
              for (std::vector<BlockTensor>& block : L.blocks)
                for (BlockTensor& t : block)
                  if (t.member == &A::ln1 || t.member == &A::ln2 || t.member == &A::lnx)
                    t.dtype = DType::F32;
              for (ContextTensor& t : L.context)
                if (t.member == &Context::lnf) t.dtype = DType::F32;
              model.prepare(ctx, L);
            } else {
              model.prepare(ctx, B, T);
            }
            fill_inputs(c.cfg, ctx);
            ctx.tokens[0] = int32_t(micro);
            out.push_back(model.forward(ctx, 1.0f / float(B * T)));
            model.backward(ctx, micro == 1);
            if (chunk.head) continue;  // a chunk without the head: its input gradient too
            for (int64_t i = 0; i < ctx.dinput.numel(); i += 7) out.push_back(ctx.dinput.f32()[i]);
          }
          for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.5f * grads[i];
        }
        out.insert(out.end(), grads.begin(), grads.end());
        EXPECT_EQ(model.weight_copy_bytes(), compute == DType::BF16 && policy != P::Off
                                                  ? weight_copy_bytes(layout, chunk)
                                                  : 0);
        return out;
      };
      EXPECT_GT(weight_copy_bytes(layout, chunk), 0);
      const std::vector<double> each_call = run(DType::BF16, P::Off, true);
      EXPECT_EQ(run(DType::BF16, P::UntilChanged, true), each_call);
      EXPECT_EQ(run(DType::BF16, P::PerPass, false), each_call);
      EXPECT_EQ(run(DType::BF16, P::Off, true, true), each_call);  // bf16 inputs: the same bits
      EXPECT_NE(run(DType::BF16, P::UntilChanged, false), each_call);  // stale copies
      run(DType::F32, P::UntilChanged, true);                          // holds none
      if (c.cfg.bf16_embeddings) {
        ModelConfig without = c.cfg;
        without.bf16_embeddings = false;
        const int64_t fewer = weight_copy_bytes(ParamLayout(without, 1, 0, &chunk), chunk);
        const ChunkRole role = chunk_role(c.cfg, chunk);
        if ((chunk.embedding && c.cfg.input_features == 0) || role.decoder_start)
          EXPECT_GT(weight_copy_bytes(layout, chunk), fewer);
        else
          EXPECT_EQ(weight_copy_bytes(layout, chunk), fewer);
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 36);
}

}  // namespace
}  // namespace trellis
