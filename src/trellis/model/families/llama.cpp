// LLaMA-style decoder (Hugging Face LlamaForCausalLM names; nn.Linear weights [out, in]): RMSNorm,
// rotary positions, grouped-query attention, SwiGLU MLP, no biases, untied head.
#include <fmt/format.h>

#include <algorithm>

#include "trellis/model/family.h"

namespace trellis {
namespace {

void configure(ModelConfig& c) {
  c.norm = NormKind::RMSNorm;
  c.norm_eps = 1e-5f;
  c.positions = PositionKind::Rope;
  c.rope_theta = 10000.0f;
  c.mlp = MlpKind::SwiGLU;
  c.bias = false;
  c.tied_head = false;
  c.causal = true;
}

void embedding(ParamBuilder& b) {
  b.token_embedding("model.embed_tokens.weight");
  if (b.config().positions == PositionKind::Learned)
    b.position_embedding("model.embed_positions.weight");
}

void block(ParamBuilder& b, int l) {
  const std::string p = fmt::format("model.layers.{}.", l);
  b.norm(Slot::AttnNorm, l, p + "input_layernorm");
  b.attention(l, p + "self_attn.", "o_proj");
  b.norm(Slot::MlpNorm, l, p + "post_attention_layernorm");
  b.mlp(l, p + "mlp.gate_proj", p + "mlp.up_proj", p + "mlp.down_proj");
}

void head(ParamBuilder& b) {
  b.norm(Slot::FinalNorm, -1, "model.norm");
  b.task_head("lm_head.weight", "score.weight", "");  // LlamaForSequenceClassification's score
}

nlohmann::json to_hf_config(const ModelConfig& m) {
  nlohmann::json j;
  j["model_type"] = "llama";
  j["architectures"] = {"LlamaForCausalLM"};
  j["hidden_size"] = m.n_embd;
  j["intermediate_size"] = m.ffn();
  j["num_attention_heads"] = m.n_head;
  j["num_key_value_heads"] = m.kv_heads();
  j["num_hidden_layers"] = m.n_layer;
  j["rms_norm_eps"] = json_number(m.norm_eps);
  j["rope_theta"] = json_number(m.rope_theta);
  j["max_position_embeddings"] = m.block_size;
  j["vocab_size"] = m.vocab_size;
  j["tie_word_embeddings"] = m.tied_head;
  j["hidden_act"] = "silu";
  j["attention_bias"] = m.bias;
  j["mlp_bias"] = m.bias;
  j["initializer_range"] = 0.02;
  return j;
}

void from_hf_config(const HfConfigReader& r, ModelConfig& m) {
  read_common_sizes(r, m);
  if (r.has("rms_norm_eps")) m.norm_eps = float(r.get_number("rms_norm_eps"));
  if (r.has("rope_theta")) m.rope_theta = float(r.get_number("rope_theta"));
  if (r.has("tie_word_embeddings")) m.tied_head = r.get_bool("tie_word_embeddings");
  if (r.has("attention_bias")) m.bias = r.get_bool("attention_bias");
  r.expect("mlp_bias", m.bias, "biases on every linear layer or on none");
  r.expect("hidden_act", "silu", "the SwiGLU MLP");
  r.expect("head_dim", m.n_embd / std::max(1, m.n_head), "hidden_size / num_attention_heads");
  r.expect("rope_scaling", nullptr, "plain rotary positions");
}

}  // namespace

extern const Family kLlamaFamily = {"llama", configure,    embedding,      block,
                                    head,    to_hf_config, from_hf_config, "llama"};

}  // namespace trellis
