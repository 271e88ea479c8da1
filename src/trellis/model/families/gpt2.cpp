// GPT-2 (Hugging Face GPT2LMHeadModel names; Conv1D weights stored [in, out], q|k|v fused).
#include <fmt/format.h>

#include "trellis/core/error.h"
#include "trellis/model/family.h"

namespace trellis {
namespace {

void configure(ModelConfig& c) {
  c.norm = NormKind::LayerNorm;
  c.norm_eps = 1e-5f;
  c.positions = PositionKind::Learned;
  c.mlp = MlpKind::Gelu;
  c.bias = true;
  c.tied_head = true;
  c.causal = true;
}

void embedding(ParamBuilder& b) {
  b.token_embedding("wte.weight");
  if (b.config().positions == PositionKind::Learned) b.position_embedding("wpe.weight");
}

void block(ParamBuilder& b, int l) {
  const ModelConfig& c = b.config();
  TRELLIS_REQUIRE(c.kv_heads() == c.n_head,
                  "model: gpt2 fuses q|k|v in c_attn and has no grouped-query attention "
                  "(n_kv_head={} != n_head={}); use a llama model",
                  c.kv_heads(), c.n_head);
  const std::string h = fmt::format("h.{}.", l);
  const int64_t C = c.n_embd, F = c.ffn();
  const int up_parts = c.mlp == MlpKind::SwiGLU ? 2 : 1;  // c_fc holds gate|up for SwiGLU
  b.norm(Slot::AttnNorm, l, h + "ln_1");
  b.linear(Slot::Qkv, l, h + "attn.c_attn", C, 3 * C, Parallel::Column, WeightLayout::InOut, 3);
  b.linear(Slot::AttnOut, l, h + "attn.c_proj", C, C, Parallel::Row, WeightLayout::InOut, 1, true);
  b.norm(Slot::MlpNorm, l, h + "ln_2");
  b.linear(Slot::MlpUp, l, h + "mlp.c_fc", C, up_parts * F, Parallel::Column, WeightLayout::InOut,
           up_parts);
  b.linear(Slot::MlpDown, l, h + "mlp.c_proj", F, C, Parallel::Row, WeightLayout::InOut, 1, true);
}

void head(ParamBuilder& b) {
  b.norm(Slot::FinalNorm, -1, "ln_f");
  b.task_head("lm_head.weight", "score.weight", "");  // GPT2ForSequenceClassification's score
}

nlohmann::json to_hf_config(const ModelConfig& m) {
  nlohmann::json j;
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["vocab_size"] = m.vocab_size;
  j["n_positions"] = m.block_size;
  j["n_ctx"] = m.block_size;
  j["n_embd"] = m.n_embd;
  j["n_layer"] = m.n_layer;
  j["n_head"] = m.n_head;
  j["n_inner"] = m.ffn_hidden > 0 ? nlohmann::json(m.ffn_hidden) : nlohmann::json(nullptr);
  j["layer_norm_epsilon"] = json_number(m.norm_eps);
  j["activation_function"] = "gelu_new";
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = m.tied_head;
  return j;
}

void from_hf_config(const HfConfigReader& r, ModelConfig& m) {
  m.n_layer = r.get_int("n_layer", 1, kMaxLayers);
  m.n_head = r.get_int("n_head", 1, kMaxHeads);
  m.n_embd = r.get_int("n_embd", 1, kMaxWidth);
  m.block_size = r.get_int("n_positions", 1, kMaxPositions);
  m.vocab_size = r.get_int("vocab_size", 1, kMaxVocab);
  if (r.has("n_inner")) m.ffn_hidden = r.get_int("n_inner", 0, kMaxFfn);
  if (r.has("layer_norm_epsilon")) m.norm_eps = float(r.get_number("layer_norm_epsilon"));
  if (r.has("tie_word_embeddings")) m.tied_head = r.get_bool("tie_word_embeddings");
  r.expect("activation_function", "gelu_new", "GPT-2's tanh GELU");
}

}  // namespace

extern const Family kGpt2Family = {"gpt2", configure,    embedding,      block,
                                   head,   to_hf_config, from_hf_config, "gpt2"};

}  // namespace trellis
