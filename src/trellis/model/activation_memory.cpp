#include "trellis/model/activation_memory.h"

#include "trellis/core/error.h"

namespace trellis {

namespace {

// The widths Transformer takes from its layout, for one tensor-parallel rank.
struct Widths {
  int64_t BT, R, full, stats, C, Hl, qkv, att, kv2, up, act, vocab_rows;
};

Widths widths(const ModelConfig& cfg, int64_t B, int64_t T, int tp, bool sp) {
  TRELLIS_REQUIRE(tp >= 1 && cfg.n_head % tp == 0 && cfg.kv_heads() % tp == 0 &&
                      cfg.ffn() % tp == 0,
                  "tp={} does not divide the heads ({}, {} key/value) and MLP width ({})", tp,
                  cfg.n_head, cfg.kv_heads(), cfg.ffn());
  const bool seq_par = sp && tp > 1;
  Widths w{};
  w.BT = B * T;
  w.R = seq_par ? w.BT / tp : w.BT;  // rows outside tensor-parallel regions
  w.full = seq_par ? w.BT : 0;       // the gathered copies sequence parallelism keeps
  w.stats = cfg.norm == NormKind::LayerNorm ? w.R : 0;  // RMSNorm keeps no mean
  w.C = cfg.n_embd;
  const int64_t hd = cfg.head_size(), Hkvl = cfg.kv_heads() / tp;
  w.Hl = cfg.n_head / tp;
  w.qkv = (w.Hl + 2 * Hkvl) * hd;
  w.att = w.Hl * hd;
  w.kv2 = 2 * Hkvl * hd;
  const int64_t mlp = cfg.mlp == MlpKind::None ? 0 : 1, Fl = cfg.ffn() / tp;
  w.up = (cfg.mlp == MlpKind::SwiGLU ? 2 : 1) * Fl * mlp;
  w.act = Fl * mlp;
  // ParamLayout's vocabulary slice: rows padded to vocab_multiple * tp, split over tp.
  const int64_t multiple = int64_t(cfg.vocab_multiple) * tp;
  w.vocab_rows = (cfg.vocab_size + multiple - 1) / multiple * multiple / tp;
  return w;
}

// Floats of one block's attention probabilities (cross-attention's too in a decoder block).
int64_t probability_floats(const Widths& w, int64_t B, int64_t T, bool decoder) {
  return (decoder ? 2 : 1) * B * w.Hl * T * T;
}

// Floats of one block's tensors in prepare's three groups: `inner` (all that full recompute drops
// but the four of `rec`), `rec` (attention probabilities, the MLP's up projection and
// activation: what selective recompute drops) and `out` (the block's output).
int64_t block_floats(const ModelConfig& cfg, const Widths& w, int64_t B, int64_t T, bool decoder,
                     int64_t inner, int64_t rec, int64_t out) {
  const int64_t mlp = cfg.mlp == MlpKind::None ? 0 : 1, x = decoder ? 1 : 0;
  // ln1 (+ stats, + gathered copy), q|k|v, attention output, attention's residual sum
  int64_t self = w.R * w.C + w.stats + w.R + w.full * w.C + w.BT * w.qkv + w.BT * w.att +
                 w.R * w.C;
  // ln2 (+ stats, + gathered copy)
  int64_t norm2 = mlp * (w.R * w.C + w.stats + w.R + w.full * w.C);
  // lnx (+ stats, + gathered copy), queries, the gathered encoder output, keys|values, output,
  // the residual sum
  int64_t cross = x * (w.R * w.C + w.stats + w.R + w.full * w.C + w.BT * w.att + w.full * w.C +
                       w.BT * w.kv2 + w.BT * w.att + w.R * w.C);
  const int64_t recomputable = probability_floats(w, B, T, decoder) + w.BT * w.up + w.BT * w.act;
  return inner * (self + norm2 + cross) + rec * recomputable + out * w.R * w.C;
}

}  // namespace

int64_t block_activation_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T, int tp,
                               bool sequence_parallel, Recompute recompute) {
  const Widths w = widths(cfg, B, T, tp, sequence_parallel);
  const int64_t inner = recompute == Recompute::Full ? 0 : 1;
  const int64_t rec = recompute == Recompute::None ? 1 : 0;
  return int64_t(sizeof(float)) * block_floats(cfg, w, B, T, decoder, inner, rec, 1);
}

int64_t block_probability_bytes(const ModelConfig& cfg, bool decoder, int64_t B, int64_t T,
                                int tp) {
  return int64_t(sizeof(float)) * probability_floats(widths(cfg, B, T, tp, false), B, T, decoder);
}

ActivationMemory activation_memory(const ModelConfig& cfg, const StageSpec& chunk, int64_t B,
                                   int64_t T, int tp, bool sequence_parallel, Recompute recompute,
                                   DType /*compute: activations stay fp32*/) {
  TRELLIS_REQUIRE(!chunk.layers.empty(), "a model chunk needs at least one block");
  const Widths w = widths(cfg, B, T, tp, sequence_parallel);
  const int64_t BT = w.BT, R = w.R, C = w.C, f = int64_t(sizeof(float));
  // The encoder-decoder's flags, as Transformer's constructor derives them from the chunk.
  bool decoder_start = false, has_decoder = false, carry_in = false, carry_out = false;
  if (cfg.encoder_decoder()) {
    const int first = chunk.layers.front(), last = chunk.layers.back(), dec = cfg.n_layer;
    decoder_start = first <= dec && dec <= last;
    has_decoder = last >= dec;
    carry_in = first > dec;
    carry_out = last >= dec && !chunk.head;
  }
  ActivationMemory m;
  for (int l : chunk.layers)
    m.blocks += block_activation_bytes(cfg, cfg.encoder_decoder() && l >= cfg.n_layer, B, T, tp,
                                       sequence_parallel, recompute);
  const int64_t head = chunk.head ? 1 : 0, embedding = chunk.embedding ? 1 : 0;
  const int64_t start = decoder_start ? 1 : 0;
  const int64_t lm = cfg.lm_head() ? head : 0, cls = head - lm, K = cfg.num_classes;
  int64_t floats = 0;
  floats += start * (R * C + w.stats + R + R * C);        // encoder output (+ stats), decoder input
  floats += head * (R * C + w.stats + R + w.full * C);    // final norm (+ stats, + gathered copy)
  floats += lm * BT * w.vocab_rows + BT;                  // logits (then their gradient), losses
  floats += cls * (B * C + B * K);                        // pooled states, class logits
  floats += embedding * R * C;                            // the embeddings' output
  floats += 2 * (1 - embedding) * (carry_in ? 2 : 1) * R * C;  // received input and its gradient
  floats += (1 - head) * (carry_out ? 2 : 1) * R * C;          // received output gradient
  floats += (carry_out ? 2 : 0) * R * C;                       // [hidden; encoder output] sent on
  m.context = m.blocks + f * floats;

  // Workspace: backward's scratch, and the groups of one block the Context does not keep.
  int64_t ws = BT * C + R * C + BT * C + BT * C + BT * w.qkv + BT * w.att + BT * w.up + BT * w.act;
  if (has_decoder) ws += R * C + BT * C + BT * w.att + BT * w.kv2;
  const int64_t inner = recompute == Recompute::Full ? 1 : 0;
  const int64_t rec = recompute == Recompute::None ? 0 : 1;
  ws += block_floats(cfg, w, B, T, has_decoder, inner, rec, 0);
  m.workspace = f * ws;
  return m;
}

}  // namespace trellis
