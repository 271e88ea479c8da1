// Encoder-decoder (the original Transformer, pre-LayerNorm as in mBART; BART-style names,
// nn.Linear weights [out, in]). One shared token embedding feeds the encoder, the decoder and the
// tied output head. Blocks [0, n_layer) are the encoder's, [n_layer, n_layer + n_dec_layer) the
// decoder's; the first decoder block also holds the encoder's final norm and the decoder's
// positions, so a pipeline can cut anywhere in the list.
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
  c.causal = true;  // the decoder's self-attention; the encoder's is bidirectional
}

void embedding(ParamBuilder& b) {
  const ModelConfig& c = b.config();
  TRELLIS_REQUIRE(c.positions == PositionKind::Learned && c.mlp == MlpKind::Gelu && c.tied_head,
                  "model: encdec has learned positions, a GELU MLP and a head tied to its shared "
                  "embedding (norm and bias can change)");
  b.token_embedding("model.shared.weight");
  b.position_embedding("model.encoder.embed_positions.weight");
}

void block(ParamBuilder& b, int l) {
  const ModelConfig& c = b.config();
  const bool decoder = l >= c.n_layer;
  if (l == c.n_layer) {
    b.norm(Slot::EncoderNorm, l, "model.encoder.layer_norm");
    b.position_embedding("model.decoder.embed_positions.weight", Slot::DecPosEmbed, l);
  }
  const std::string p = decoder ? fmt::format("model.decoder.layers.{}.", l - c.n_layer)
                                : fmt::format("model.encoder.layers.{}.", l);
  b.norm(Slot::AttnNorm, l, p + "self_attn_layer_norm");
  b.attention(l, p + "self_attn.", "out_proj");
  if (decoder) {
    b.norm(Slot::CrossNorm, l, p + "encoder_attn_layer_norm");
    b.attention(l, p + "encoder_attn.", "out_proj", true);
  }
  b.norm(Slot::MlpNorm, l, p + "final_layer_norm");
  b.mlp(l, p + "fc_gate", p + "fc1", p + "fc2");
}

void head(ParamBuilder& b) { b.norm(Slot::FinalNorm, -1, "model.decoder.layer_norm"); }

nlohmann::json to_hf_config(const ModelConfig& m) {
  nlohmann::json j;
  j["model_type"] = "trellis-encoder-decoder";
  j["architectures"] = {"TrellisEncoderDecoder"};
  j["d_model"] = m.n_embd;
  j["encoder_layers"] = m.n_layer;
  j["decoder_layers"] = m.n_dec_layer;
  j["encoder_attention_heads"] = j["decoder_attention_heads"] = m.n_head;
  j["num_key_value_heads"] = m.kv_heads();
  j["encoder_ffn_dim"] = j["decoder_ffn_dim"] = m.ffn();
  j["max_position_embeddings"] = m.block_size;
  j["vocab_size"] = m.vocab_size;
  j["layer_norm_eps"] = json_number(m.norm_eps);
  j["tie_word_embeddings"] = true;
  j["activation_function"] = "gelu_new";
  j["scale_embedding"] = false;
  return j;
}

void from_hf_config(const HfConfigReader& r, ModelConfig& m) {
  m.n_embd = r.get_int("d_model", 1, kMaxWidth);
  m.n_layer = r.get_int("encoder_layers", 1, kMaxLayers);
  m.n_dec_layer = r.get_int("decoder_layers", 0, kMaxLayers);
  m.n_head = r.get_int("encoder_attention_heads", 1, kMaxHeads);
  m.n_kv_head = r.has("num_key_value_heads") ? r.get_int("num_key_value_heads", 0, kMaxHeads) : 0;
  m.ffn_hidden = r.get_int("encoder_ffn_dim", 0, kMaxFfn);
  m.block_size = r.get_int("max_position_embeddings", 1, kMaxPositions);
  m.vocab_size = r.get_int("vocab_size", 1, kMaxVocab);
  if (r.has("layer_norm_eps")) m.norm_eps = float(r.get_number("layer_norm_eps"));
  r.expect("decoder_attention_heads", m.n_head, "as many heads as the encoder");
  r.expect("decoder_ffn_dim", m.ffn_hidden, "the encoder's MLP width");
  r.expect("activation_function", "gelu_new", "the tanh GELU");
  r.expect("scale_embedding", false, "unscaled embeddings");
  r.expect("tie_word_embeddings", true, "one shared embedding");
}

}  // namespace

extern const Family kEncDecFamily = {
    "encdec", configure,    embedding,      block,
    head,     to_hf_config, from_hf_config, "trellis-encoder-decoder",
    true};

}  // namespace trellis
