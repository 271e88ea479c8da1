#pragma once
// Parameters as one flat buffer with named views (DESIGN invariant 4). Gradients and optimizer
// state use the same layout, so DDP buckets, ZeRO shards and checkpoints are slices.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "trellis/model/config.h"

namespace trellis {

struct ParamSpec {
  std::string name;             // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;   // global shape as stored (wte has padded_vocab rows)
  int64_t export_rows = -1;     // rows written to checkpoints (wte: true vocab); -1 = all
  float init_std = 0.0f;        // 0 => constant init_value
  float init_value = 0.0f;
  int64_t init_rows = -1;       // rows drawn from the RNG; the rest (padding) stay zero
  bool decay = false;           // weight decay applies (2-D weights only)
  size_t offset = 0;            // into the flat buffer
  size_t numel() const;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& cfg);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(const std::string& name) const;
  size_t size() const { return size_; }
  // Offset of the first parameter of block l (blocks are stored in order after wte, wpe).
  size_t block_offset(int l) const;
  // Parameters counted for FLOPs/MFU (true vocabulary rows only).
  int64_t count() const;

 private:
  void add(ParamSpec s);
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  size_t size_ = 0;
};

// Fills the flat parameter buffer: each element is a pure function of (seed, name, index).
void init_params(const ParamLayout& layout, uint64_t seed, float* params);

}  // namespace trellis
