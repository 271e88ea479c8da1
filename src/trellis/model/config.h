#pragma once
// Transformer hyper-parameters: the sizes, and the block choices a family fixes (norm, positions,
// MLP, biases, tied head, attention mask). A preset names a family and its sizes.
#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace trellis {

enum class NormKind : uint8_t { LayerNorm, RMSNorm };
enum class PositionKind : uint8_t { Learned, Rope };
enum class MlpKind : uint8_t { Gelu, SwiGLU, None };  // None: attention-only blocks (encoder)
// How a classifier reduces the final hidden states of a sequence to one vector.
enum class Pooling : uint8_t { Mean, Cls, Last };

// The largest sizes a model may have: far above what trellis can train on a CPU, low enough that
// products of sizes stay within int64 and a malformed config cannot ask for absurd allocations.
constexpr int kMaxLayers = 4096;
constexpr int kMaxHeads = 4096;
constexpr int kMaxWidth = 1 << 17;      // n_embd
constexpr int kMaxFfn = 1 << 20;        // ffn_hidden
constexpr int kMaxPositions = 1 << 24;  // block_size
constexpr int kMaxVocab = 1 << 24;      // vocab_size, vocab_multiple, num_classes
constexpr int kMaxFeatures = 1 << 24;   // input_features
constexpr int kMaxNgram = 32;           // ngram_max
constexpr int64_t kMaxParams = int64_t(1) << 36;

struct ModelConfig {
  std::string arch = "gpt2";  // the family: gpt2 | llama | encoder | encdec (model/families/)
  int n_layer = 2;            // blocks (an encoder-decoder's encoder blocks)
  int n_dec_layer = 0;        // an encoder-decoder's decoder blocks, after the encoder's; 0 = none
  int n_head = 2;
  int n_kv_head = 0;  // key/value heads (grouped-query attention); 0 = n_head
  int n_embd = 64;
  int ffn_hidden = 0;       // MLP width; 0 = 4 * n_embd
  int block_size = 64;      // context length (n_positions)
  int vocab_size = 256;     // true vocabulary; comes from the tokenizer/data
  int vocab_multiple = 64;  // rows of the embedding padded up to a multiple of this (speed only)

  // Set by the family (Family::configure), not by users.
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;
  PositionKind positions = PositionKind::Learned;
  float rope_theta = 10000.0f;
  MlpKind mlp = MlpKind::Gelu;
  bool bias = true;       // linear layers have biases
  bool tied_head = true;  // the output projection is the token embedding
  bool causal = true;     // decoder (causal) or encoder (bidirectional) self-attention

  // The task head. 0 classes: the language-model head over the vocabulary; more: a classifier
  // over the pooled final hidden states (mean or first token of the real positions, or the last
  // real one as GPT2ForSequenceClassification does).
  int num_classes = 0;
  Pooling pooling = Pooling::Mean;
  // > 0: inputs are vectors of this many features (image patches) that a linear layer projects,
  // where text uses the token embedding (encoder only).
  int input_features = 0;
  // > 0: fastText-style subword features (model/subword_ngrams.h): the mean of the hashed
  // character n-gram embeddings (ngram_min..ngram_max characters) of each token's word, from a
  // table of this many rows (embed_ngrams.weight), added to the token embedding. Encoder only.
  int subword_ngrams = 0;
  int ngram_min = 2, ngram_max = 5;

  // Dropout probabilities in [0, 1) (inverted; drawn only in a training forward, see Context):
  // `dropout` on the embedding output (an encoder-decoder's decoder embedding too) and on each
  // residual branch (after attention's, cross-attention's and the MLP's output projection);
  // `attn_dropout` on the attention probabilities (self and cross); `classifier_dropout` on a
  // classifier's pooled vector. Not stored in checkpoints (run settings, like the optimizer's).
  float dropout = 0.0f, attn_dropout = 0.0f, classifier_dropout = 0.0f;

  // A bf16 model's lookups of its tables (token, learned position, an encoder-decoder's decoder
  // position and subword n-gram embeddings) read the tables rounded to bf16, as its GEMMs read
  // the weights, and write fp32 rows; false: fp32 as autocast does. So mixed-precision state
  // keeps no fp32 replica of them (model/model_chunk.h read_as_bf16_only). No effect in fp32.
  // Stored in checkpoints (config.json), so that evaluating in bf16 reads them the same way.
  bool bf16_embeddings = false;

  // Rows of the token embedding (and vocabulary head): the vocabulary padded to a multiple of
  // vocab_multiple * tp, so that each of tp vocabulary-parallel ranks holds the same number.
  int64_t padded_vocab(int tp = 1) const {
    const int64_t multiple = int64_t(vocab_multiple) * tp;
    return (vocab_size + multiple - 1) / multiple * multiple;
  }
  int head_size() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  bool encoder_decoder() const { return n_dec_layer > 0; }
  bool lm_head() const { return num_classes == 0; }
  // The vocabulary head is the token embedding (a classifier has no vocabulary head).
  bool tied_lm_head() const { return tied_head && lm_head(); }
  // The blocks a pipeline partitions: an encoder-decoder's encoder blocks, then its decoder's.
  int total_layers() const { return n_layer + n_dec_layer; }
  // Throws an input error for impossible shapes.
  void validate() const;
};

// The block choices as {"norm", "positions", "mlp", "bias", "tied_head"} and, for a classifier,
// {"num_classes", "pooling", "input_features"} (config.json's "trellis" section: Hugging Face
// configs cannot say e.g. RMSNorm for GPT-2), and back.
nlohmann::json block_choices(const ModelConfig& cfg);
void set_block_choices(const nlohmann::json& j, ModelConfig& cfg, const std::string& where);

// Presets: tiny, baby, gpt2, gpt2-medium, gpt2-large, gpt2-xl (GPT-2); llama-tiny, llama-baby;
// encoder-tiny, encoder-baby; encdec-tiny, encdec-baby, seq2seq-tiny, seq2seq-baby,
// transformer-base. vocab_size is left as is.
const char* pooling_name(Pooling p);
ModelConfig model_preset(const std::string& name, ModelConfig base = {});
std::vector<std::string> model_preset_names();

}  // namespace trellis
