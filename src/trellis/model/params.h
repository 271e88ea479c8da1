#pragma once
// Parameters as one flat buffer with named views (DESIGN invariant 4). Gradients and optimizer
// state use the same layout, so DDP buckets, ZeRO shards and checkpoints are slices.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "trellis/model/config.h"

namespace trellis {

// How a tensor is cut across the tensor-parallel group (Megatron-LM): column-parallel weights
// split their output columns (c_attn: each of q, k, v separately, so heads stay whole),
// row-parallel weights split their input rows, the embedding splits its (padded) vocabulary rows.
enum class TpSplit { None, Columns, Rows };

struct ParamSpec {
  std::string name;            // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // this rank's shape (the global one when tp = 1)
  std::vector<int64_t> global_shape;
  TpSplit split = TpSplit::None;
  int parts = 1;             // column groups split separately (c_attn: q|k|v = 3)
  int64_t export_rows = -1;  // global rows written to checkpoints (wte: true vocab); -1 = all
  float init_std = 0.0f;     // 0 => constant init_value
  float init_value = 0.0f;
  int64_t init_rows = -1;  // rows drawn from the RNG; the rest (padding) stay zero
  bool decay = false;      // weight decay applies (2-D weights only)
  size_t offset = 0;       // into the flat buffer
  size_t numel() const;
  // Index into the global tensor of element i of this rank's slice.
  int64_t global_index(int64_t i, int tp_rank) const;
};

// The part of the model a pipeline rank holds: some blocks, maybe the embedding (first stage),
// maybe the final LayerNorm and head (last stage; the head is tied to the embedding, so a last
// stage holds its own copy of wte).
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
  const StageSpec& stage() const { return stage_; }
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  int tp() const { return tp_; }
  int tp_rank() const { return tp_rank_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(const std::string& name) const;
  size_t size() const { return size_; }
  // Offset of the first parameter of block l (blocks are stored in order after wte, wpe).
  size_t block_offset(int l) const;
  // Parameters counted for FLOPs/MFU (true vocabulary rows only; for the whole model when this
  // layout is).
  int64_t count() const;
  // Padded vocabulary rows held by this rank and the first of them.
  int64_t vocab_local() const { return vocab_local_; }
  int64_t vocab_start() const { return vocab_local_ * tp_rank_; }

 private:
  void add(ParamSpec s);
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  size_t size_ = 0;
  int tp_ = 1, tp_rank_ = 0;
  int64_t vocab_local_ = 0;
  StageSpec stage_;
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
