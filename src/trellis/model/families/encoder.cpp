// Bidirectional encoder (BERT-like in use, pre-LayerNorm as in fairseq/BART with
// normalize_before; their parameter names, nn.Linear weights [out, in]). Its LM-style head, tied
// to the token embedding, serves the oracle tests; task heads sit on the same blocks.
#include <fmt/format.h>

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
  c.causal = false;
}

void embedding(ParamBuilder& b) {
  if (b.config().input_features > 0)
    b.feature_embedding("embed_features");  // the seed network's Dense over image patches
  else
    b.token_embedding("embed_tokens.weight");
  if (b.config().subword_ngrams > 0) b.ngram_embedding("embed_ngrams.weight");
  if (b.config().positions == PositionKind::Learned) b.position_embedding("embed_positions.weight");
}

void block(ParamBuilder& b, int l) {
  const std::string p = fmt::format("layers.{}.", l);
  b.norm(Slot::AttnNorm, l, p + "self_attn_layer_norm");
  b.attention(l, p + "self_attn.", "out_proj");
  if (b.config().mlp == MlpKind::None) return;  // attention-only blocks
  b.norm(Slot::MlpNorm, l, p + "final_layer_norm");
  b.mlp(l, p + "fc_gate", p + "fc1", p + "fc2");
}

void head(ParamBuilder& b) {
  b.norm(Slot::FinalNorm, -1, "layer_norm");
  b.task_head("lm_head.weight", "classifier.weight", b.config().bias ? "classifier.bias" : "");
}

nlohmann::json to_hf_config(const ModelConfig& m) {
  nlohmann::json j;
  j["model_type"] = "trellis-encoder";
  j["architectures"] = {"TrellisEncoder"};
  j["hidden_size"] = m.n_embd;
  j["intermediate_size"] = m.ffn();
  j["num_attention_heads"] = m.n_head;
  j["num_key_value_heads"] = m.kv_heads();
  j["num_hidden_layers"] = m.n_layer;
  j["max_position_embeddings"] = m.block_size;
  j["vocab_size"] = m.vocab_size;
  j["layer_norm_eps"] = json_number(m.norm_eps);
  j["tie_word_embeddings"] = m.tied_head;
  j["hidden_act"] = "gelu_new";
  return j;
}

void from_hf_config(const HfConfigReader& r, ModelConfig& m) {
  read_common_sizes(r, m);
  if (r.has("layer_norm_eps")) m.norm_eps = float(r.get_number("layer_norm_eps"));
  if (r.has("tie_word_embeddings")) m.tied_head = r.get_bool("tie_word_embeddings");
  r.expect("hidden_act", "gelu_new", "the tanh GELU");
}

}  // namespace

extern const Family kEncoderFamily = {"encoder", configure,    embedding,      block,
                                      head,      to_hf_config, from_hf_config, "trellis-encoder"};

}  // namespace trellis
