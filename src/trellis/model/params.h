#pragma once
// Parameters as one flat buffer with named views (DESIGN invariant 4). Gradients and optimizer
// state use the same layout, so DDP buckets, ZeRO shards and checkpoints are slices. A family file
// (model/families/) declares each tensor through a ParamBuilder: its Hugging Face name, its role
// in the block (Slot), and how tensor parallelism splits it; nothing else names parameters.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "trellis/model/config.h"

namespace trellis {

// What a tensor is to the model. A linear layer's weight may be one fused tensor (Qkv, MlpUp) or
// several pieces that write consecutive output columns (Q, K, V; Gate, Up).
// A classifier's head is Classifier; an encoder reading feature vectors (image patches) projects
// them with FeatureEmbed where text has TokEmbed. NgramEmbed is the hashed character n-gram
// table of subword features (model/subword_ngrams.h).
// An encoder-decoder's first decoder block also holds the encoder's final norm (EncoderNorm) and
// the decoder's positions (DecPosEmbed); its decoder blocks add cross-attention (Cross*).
// clang-format off
enum class Slot : uint8_t {
  TokEmbed, PosEmbed, FinalNorm, Head,
  AttnNorm, Qkv, Q, K, V, AttnOut,
  CrossNorm, CrossQ, CrossK, CrossV, CrossOut,
  MlpNorm, MlpUp, Gate, Up, MlpDown,
  EncoderNorm, DecPosEmbed,
  FeatureEmbed, Classifier, NgramEmbed,
};
// clang-format on

// Tensor parallelism (Megatron-LM): column-parallel layers split their outputs (each of `parts`
// fused groups separately, so q|k|v heads stay whole), row-parallel layers their inputs, the
// vocabulary-parallel embedding and head their (padded) vocabulary rows.
enum class Parallel : uint8_t { None, Column, Row, Vocab };
// How a linear weight is stored: HF GPT-2's Conv1D [in, out] or nn.Linear's [out, in].
enum class WeightLayout : uint8_t { InOut, OutIn };

struct ParamSpec {
  std::string name;            // Hugging Face name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // this rank's shape (the global one when tp = 1)
  std::vector<int64_t> global_shape;
  Slot slot = Slot::TokEmbed;
  int layer = -1;  // block index, -1 outside the blocks
  bool bias = false;
  WeightLayout layout = WeightLayout::InOut;
  int split_dim = -1;        // dimension cut across the tensor-parallel group, -1 = replicated
  int parts = 1;             // fused groups split separately along split_dim
  int64_t export_rows = -1;  // global rows written to checkpoints (embedding: true vocab); -1 = all
  float init_std = 0.0f;     // 0 => constant init_value
  float init_value = 0.0f;
  int64_t init_rows = -1;  // rows drawn from the RNG; the rest (padding) stay zero
  bool decay = false;      // weight decay applies (2-D weights only)
  bool tied = false;       // used in more than one place (tied head, encoder-decoder's decoder)
  bool tied_copy = false;  // a later pipeline stage's copy of a tied tensor owned by stage 0
  size_t offset = 0;       // into the flat buffer
  size_t numel() const;
  // Index into the global tensor of element i of this rank's slice.
  int64_t global_index(int64_t i, int tp_rank) const;
};

// A range [begin, end) of a layout's flat buffer. What a rank owns under ZeRO (its optimizer
// state, its checkpoint pieces) is a list of them, its data held compact: the ranges' elements
// concatenated in order.
struct FlatRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
size_t total_size(const std::vector<FlatRange>& ranges);

// The part of the model a pipeline rank holds: some blocks, maybe the embedding (first stage),
// maybe the final norm and head (last stage). A stage that uses the token embedding without owning
// it (a tied head; an encoder-decoder's decoder start) holds its own copy.
struct StageSpec {
  std::vector<int> layers;
  bool embedding = true, head = true;
  static StageSpec whole(const ModelConfig& cfg);
};

class ParamLayout {
 public:
  // The slice of the model held by tensor-parallel rank tp_rank of tp, for the blocks of `stage`
  // (default: the whole model).
  explicit ParamLayout(const ModelConfig& cfg, int tp = 1, int tp_rank = 0,
                       const StageSpec* stage = nullptr);
  const ModelConfig& config() const { return cfg_; }
  const StageSpec& stage() const { return stage_; }
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  int tp() const { return tp_; }
  int tp_rank() const { return tp_rank_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(const std::string& name) const;
  // The tensor of (slot, layer, bias) or null.
  const ParamSpec* find(Slot slot, int layer, bool bias = false) const;
  size_t size() const { return size_; }
  // Offset of the first parameter of block l (blocks are stored in order after the embeddings).
  size_t block_offset(int l) const;
  // Parameters counted for FLOPs/MFU (true vocabulary rows only; for the whole model when this
  // layout is).
  int64_t count() const;
  // Padded vocabulary rows held by this rank and the first of them.
  int64_t vocab_local() const { return vocab_local_; }
  int64_t vocab_start() const { return vocab_local_ * tp_rank_; }

 private:
  friend class ParamBuilder;
  void add(ParamSpec s);
  ModelConfig cfg_;
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  size_t size_ = 0;
  int tp_ = 1, tp_rank_ = 0;
  int64_t vocab_local_ = 0;
  StageSpec stage_;
};

// What family files declare parameters with. Initial values follow GPT-2: N(0, 0.02) weights,
// residual output projections scaled by 1/sqrt(2 n_layer), zero biases, unit norm weights.
class ParamBuilder {
 public:
  ParamBuilder(ParamLayout& layout, bool tied_copy_only)
      : layout_(layout), cfg_(layout.cfg_), tied_copy_only_(tied_copy_only) {}
  const ModelConfig& config() const { return cfg_; }
  // Vocabulary-parallel [padded vocab, C] token embedding (tied to the head if the config says).
  void token_embedding(const std::string& name);
  // Learned positions [block_size, C] (slot PosEmbed, or DecPosEmbed of block `layer`).
  void position_embedding(const std::string& name, Slot slot = Slot::PosEmbed, int layer = -1);
  // prefix.weight (and prefix.bias for LayerNorm) of width C.
  void norm(Slot slot, int layer, const std::string& prefix);
  // prefix.weight [in, out] or [out, in], and prefix.bias [out] when the config has biases.
  void linear(Slot slot, int layer, const std::string& prefix, int64_t in, int64_t out,
              Parallel how, WeightLayout layout, int parts = 1, bool residual_out = false);
  // Separate q, k, v (column-parallel, grouped-query widths) and output (row-parallel)
  // projections in nn.Linear layout: prefix + "{q,k,v}_proj" and prefix + out_name.
  void attention(int layer, const std::string& prefix, const std::string& out_name,
                 bool cross = false);
  // The MLP in nn.Linear layout: `up` alone (GELU) or `gate` and `up` (SwiGLU), then `down`.
  void mlp(int layer, const std::string& gate, const std::string& up, const std::string& down);
  // Untied vocabulary-parallel output projection [padded vocab, C] (nn.Linear layout).
  void head(const std::string& name);
  // The head of the task: the classifier when the config has classes, else the untied
  // vocabulary head `lm_name` (a tied head needs no tensor of its own).
  void task_head(const std::string& lm_name, const std::string& classifier_weight,
                 const std::string& classifier_bias);
  // The classifier [num_classes, C] (nn.Linear layout; bias when bias_name is not empty),
  // replicated on every tensor-parallel rank.
  void classifier(const std::string& weight_name, const std::string& bias_name);
  // The projection of feature vectors [C, input_features] with its bias (prefix.weight/.bias).
  void feature_embedding(const std::string& prefix);
  // The subword n-gram table [subword_ngrams, C], replicated on every tensor-parallel rank.
  void ngram_embedding(const std::string& name);

 private:
  void add(ParamSpec s, Parallel how);
  ParamLayout& layout_;
  const ModelConfig& cfg_;
  bool tied_copy_only_;
};

// Fills this rank's flat parameter buffer: each element is a pure function of (seed, name, global
// index), so every layout starts from the same global weights.
void init_params(const ParamLayout& layout, uint64_t seed, float* params);
// Copies this rank's slices out of / into a flat buffer in the tp = 1 layout of the same model.
void copy_from_global(const ParamLayout& local, const ParamLayout& global, const float* src,
                      float* dst);
void scatter_to_global(const ParamLayout& local, const ParamLayout& global, const float* src,
                       float* dst);

}  // namespace trellis
