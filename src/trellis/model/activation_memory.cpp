#include "trellis/model/activation_memory.h"

#include "trellis/core/error.h"

namespace trellis {

namespace {
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t bytes(const std::vector<int64_t>& shape, DType dtype) {
  return numel(shape) * int64_t(dtype_size(dtype));
}

// Bytes of a block's tensors that a Context keeps under `recompute`.
int64_t kept_bytes(const std::vector<BlockTensor>& block, Recompute recompute,
                   bool split_backward = false) {
  int64_t n = 0;
  for (const BlockTensor& t : block)
    if (context_keeps(recompute, t.group, split_backward)) n += bytes(t.shape, t.dtype);
  return n;
}
}  // namespace

ActivationDims activation_dims(const ModelConfig& cfg, int64_t B, int64_t T, int tp,
                               bool sequence_parallel) {
  TRELLIS_REQUIRE(
      tp >= 1 && cfg.n_head % tp == 0 && cfg.kv_heads() % tp == 0 && cfg.ffn() % tp == 0,
      "tp={} does not divide the heads ({}, {} key/value) and MLP width ({})", tp, cfg.n_head,
      cfg.kv_heads(), cfg.ffn());
  const bool seq_par = sequence_parallel && tp > 1;
  ActivationDims d;
  d.B = B;
  d.T = T;
  d.BT = B * T;
  d.R = seq_par ? d.BT / tp : d.BT;
  d.full = seq_par ? d.BT : 0;
  d.stats = cfg.norm == NormKind::LayerNorm ? d.R : 0;
  d.C = cfg.n_embd;
  const int64_t hd = cfg.head_size(), Hkvl = cfg.kv_heads() / tp;
  d.Hl = cfg.n_head / tp;
  d.qkv = (d.Hl + 2 * Hkvl) * hd;
  d.att = d.Hl * hd;
  d.kv2 = 2 * Hkvl * hd;
  const int64_t mlp = cfg.mlp == MlpKind::None ? 0 : 1, Fl = cfg.ffn() / tp;
  d.up = (cfg.mlp == MlpKind::SwiGLU ? 2 : 1) * Fl * mlp;
  d.act = Fl * mlp;
  d.vocab_rows = cfg.padded_vocab(tp) / tp;
  return d;
}

ChunkRole chunk_role(const ModelConfig& cfg, const StageSpec& chunk) {
  TRELLIS_REQUIRE(!chunk.layers.empty(), "a model chunk needs at least one block");
  ChunkRole r;
  r.embedding = chunk.embedding;
  r.head = chunk.head;
  if (cfg.encoder_decoder()) {
    const int first = chunk.layers.front(), last = chunk.layers.back(), dec = cfg.n_layer;
    r.decoder_start = first <= dec && dec <= last;
    r.has_decoder = last >= dec;
    r.carry_in = first > dec;
    r.carry_out = last >= dec && !chunk.head;
  }
  return r;
}

bool context_keeps(Recompute policy, ActGroup group, bool split_backward) {
  switch (group) {
    case ActGroup::WeightGrad:
      return split_backward;
    case ActGroup::Inner:
      return policy != Recompute::Full;
    case ActGroup::Recomputable:
      return policy == Recompute::None;
    case ActGroup::Output:
      return true;
  }
  return true;
}

bool rebuilt_in_workspace(Recompute policy, ActGroup group) {
  return (group == ActGroup::Inner || group == ActGroup::Recomputable) &&
         !context_keeps(policy, group);
}

int64_t GradScratch::floats() const {
  return full + dres + dln + dfull + dqkv + datt + dup + dact + denc + denc_full + dxq + dxkv;
}

std::vector<BlockTensor> block_tensors(const ModelConfig& cfg, const ActivationDims& d,
                                       bool decoder, DType compute) {
  // The saved GEMM inputs kept in bf16 (the norms' outputs only where no gather reads them), and
  // the GEMM outputs that element-wise kernels read in bf16: q|k|v (attention) and the up
  // projection (the MLP activation).
  const DType act = compute, norm = d.full == 0 ? compute : DType::F32;
  using A = Context::BlockActs;
  constexpr ActGroup in = ActGroup::Inner, rec = ActGroup::Recomputable;
  const int64_t m = cfg.mlp == MlpKind::None ? 0 : 1, x = decoder ? 1 : 0;
  const int64_t B = d.B, T = d.T, BT = d.BT, R = d.R, C = d.C, full = d.full, st = d.stats;
  return {
      // ln1 (+ stats, + gathered copy), q|k|v, attention, attention's residual sum
      {&A::ln1, in, {R, C}, norm},
      {&A::ln1_mean, in, {st}},
      {&A::ln1_rstd, in, {R}},
      {&A::ln1_full, in, {full, C}},
      {&A::qkv, in, {BT, d.qkv}, act},
      {&A::lse, in, {B, d.Hl, T}},
      {&A::att, in, {BT, d.att}},
      {&A::res_mid, in, {R, C}},
      // ln2 (+ stats, + gathered copy), the MLP's up projection and activation, the output
      {&A::ln2, in, {m * R, C}, norm},
      {&A::ln2_mean, in, {m * st}},
      {&A::ln2_rstd, in, {m * R}},
      {&A::ln2_full, in, {m * full, C}},
      {&A::up, rec, {BT, d.up}, act},
      {&A::act, rec, {BT, d.act}, act},
      {&A::res_out, ActGroup::Output, {R, C}},
      // cross-attention: lnx (+ stats, + gathered copy), queries, the gathered encoder output,
      // keys|values, logsumexp, output, the residual sum
      {&A::lnx, in, {x * R, C}, norm},
      {&A::lnx_mean, in, {x * st}},
      {&A::lnx_rstd, in, {x * R}},
      {&A::lnx_full, in, {x * full, C}},
      {&A::xq, in, {x * BT, d.att}},
      {&A::enc_full, in, {x * full, C}},
      {&A::xkv, in, {x * BT, d.kv2}},
      {&A::xlse, in, {x * B, d.Hl, T}},
      {&A::xatt, in, {x * BT, d.att}},
      {&A::res_x, in, {x * R, C}},
      // a split backward's output gradients of attention's, the MLP's and cross-attention's
      // output projections (all rows: they leave the tensor-parallel region's backward)
      {&A::dproj, ActGroup::WeightGrad, {BT, C}},
      {&A::ddown, ActGroup::WeightGrad, {m * BT, C}},
      {&A::dxproj, ActGroup::WeightGrad, {x * BT, C}},
      // ... and of the up projection and q|k|v, which they cannot hold themselves in bf16
      {&A::dup, ActGroup::WeightGrad, {(compute == DType::BF16 ? m : 0) * BT, d.up}},
      {&A::dqkv, ActGroup::WeightGrad, {(compute == DType::BF16 ? 1 : 0) * BT, d.qkv}},
  };
}

ActivationLayout activation_layout(const ModelConfig& cfg, const StageSpec& chunk, int64_t B,
                                   int64_t T, int tp, bool sequence_parallel, DType compute) {
  ActivationLayout L;
  L.dims = activation_dims(cfg, B, T, tp, sequence_parallel);
  L.role = chunk_role(cfg, chunk);
  const ActivationDims& d = L.dims;
  const ChunkRole& r = L.role;
  for (int l : chunk.layers)
    L.blocks.push_back(
        block_tensors(cfg, d, cfg.encoder_decoder() && l >= cfg.n_layer, compute));
  L.workspace_block = block_tensors(cfg, d, r.has_decoder, compute);

  const int64_t BT = d.BT, R = d.R, C = d.C;
  const int64_t head = r.head ? 1 : 0, embedding = r.embedding ? 1 : 0;
  const int64_t start = r.decoder_start ? 1 : 0;
  const int64_t lm = cfg.lm_head() ? head : 0, cls = head - lm;
  const int64_t in_rows = (1 - embedding) * (r.carry_in ? 2 : 1) * R;
  L.context = {
      // at the first decoder block: the encoder's output (+ stats) and the decoder's input
      {&Context::enc, {start * R, C}},
      {&Context::enc_mean, {start * d.stats}},
      {&Context::enc_rstd, {start * R}},
      {&Context::dec_embedded, {start * R, C}},
      // the final norm (+ stats, + gathered copy)
      // a classifier pools it in fp32
      {&Context::lnf, {head * R, C}, cfg.lm_head() && d.full == 0 ? compute : DType::F32},
      {&Context::lnf_mean, {head * d.stats}},
      {&Context::lnf_rstd, {head * R}},
      {&Context::lnf_full, {head * d.full, C}},
      // the logits, then their gradient: bf16 in a bf16 model (autocast's head output; the loss
      // reads them in fp32 math and writes the gradient rounded over them)
      {&Context::logits_or_grad, {lm * BT, d.vocab_rows}, compute},
      {&Context::losses, {BT}},
      {&Context::pooled, {cls * B, C}},
      {&Context::class_logits_or_grad, {cls * B, cfg.num_classes}},
      {&Context::embedded, {embedding * R, C}},
      {&Context::input, {in_rows, C}},  // received input and its gradient
      {&Context::dinput, {in_rows, C}},
      {&Context::doutput, {(1 - head) * (r.carry_out ? 2 : 1) * R, C}},  // received gradient
      {&Context::carry, {(r.carry_out ? 2 : 0) * R, C}},  // [hidden; encoder output] sent on
  };

  GradScratch& s = L.scratch;
  s.full = BT * C, s.dres = R * C, s.dln = BT * C, s.dfull = BT * C;
  s.dqkv = BT * d.qkv, s.datt = BT * d.att, s.dup = BT * d.up, s.dact = BT * d.act;
  if (r.has_decoder) s.denc = R * C, s.denc_full = BT * C, s.dxq = BT * d.att, s.dxkv = BT * d.kv2;
  return L;
}

ActivationMemory activation_memory(const ActivationLayout& layout, Recompute recompute,
                                   bool split_backward) {
  const int64_t f = int64_t(sizeof(float));
  ActivationMemory m;
  for (const std::vector<BlockTensor>& block : layout.blocks)
    m.blocks += kept_bytes(block, recompute, split_backward);
  int64_t outside = 0;
  for (const ContextTensor& t : layout.context) outside += bytes(t.shape, t.dtype);
  m.context = m.blocks + outside;
  // The workspace: backward's scratch, and the groups of one block the Context does not keep.
  int64_t rebuilt = 0;
  for (const BlockTensor& t : layout.workspace_block)
    if (rebuilt_in_workspace(recompute, t.group)) rebuilt += bytes(t.shape, t.dtype);
  m.workspace = f * layout.scratch.floats() + rebuilt;
  return m;
}

ActivationMemory activation_memory(const ModelConfig& cfg, const StageSpec& chunk, int64_t B,
                                   int64_t T, int tp, bool sequence_parallel, Recompute recompute,
                                   DType compute, bool split_backward) {
  return activation_memory(activation_layout(cfg, chunk, B, T, tp, sequence_parallel, compute),
                           recompute, split_backward);
}

int64_t block_activation_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T, int tp,
                               bool sequence_parallel, Recompute recompute, DType compute) {
  return kept_bytes(
      block_tensors(cfg, activation_dims(cfg, B, T, tp, sequence_parallel), decoder, compute),
      recompute);
}

int64_t block_attention_state_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T,
                                    int tp) {
  int64_t floats = 0;
  for (const BlockTensor& t : block_tensors(cfg, activation_dims(cfg, B, T, tp, false), decoder))
    if (t.member == &Context::BlockActs::lse || t.member == &Context::BlockActs::xlse)
      floats += numel(t.shape);
  return int64_t(sizeof(float)) * floats;
}

}  // namespace trellis
