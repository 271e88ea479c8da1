#pragma once
// AdamW (decoupled weight decay, PyTorch's update order) and SGD with momentum over a flat
// parameter buffer, restricted to the ranges a rank owns (ZeRO: its shard; else everything).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trellis/model/params.h"

namespace trellis {

struct OptimConfig {
  std::string name = "adamw";  // adamw | sgd
  float lr = 6e-4f;
  float min_lr = 6e-5f;  // cosine decays to this
  int warmup_steps = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float momentum = 0.9f;   // sgd
  float grad_clip = 1.0f;  // global-norm clip; 0 disables
};

// Linear warmup over warmup_steps, then cosine from lr to min_lr at total_steps. step is 1-based.
float learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps);

class Optimizer {
 public:
  // Holds state for `owned`, ranges of layout's flat buffer (their elements concatenated: the
  // compact form).
  Optimizer(const OptimConfig& cfg, const ParamLayout& layout, std::vector<FlatRange> owned);
  // One range [begin, end) (ZeRO-1's shard, or the whole buffer).
  Optimizer(const OptimConfig& cfg, const ParamLayout& layout, size_t begin, size_t end)
      : Optimizer(cfg, layout, std::vector<FlatRange>{{begin, end}}) {}
  // One update of the owned parameters from their gradients, both compact. step is 1-based
  // (bias correction). grad_mul multiplies each gradient first (the global-norm clip factor):
  // identical to ops::scale(grads, grad_mul) before the step, without the extra sweep. grads is
  // left unchanged.
  void step_compact(float* params, const float* grads, float lr, int64_t step,
                    float grad_mul = 1.0f);
  // The same over whole flat buffers (indexed like the layout) when one range is owned.
  void step(float* params, const float* grads, float lr, int64_t step, float grad_mul = 1.0f);
  // State tensors for checkpoints: "exp_avg"/"exp_avg_sq" (adamw) or "momentum_buffer" (sgd),
  // each compact over the owned ranges.
  std::vector<std::pair<std::string, std::vector<float>*>> state();
  const std::vector<FlatRange>& owned() const { return owned_; }
  size_t begin() const { return owned_.front().begin; }
  size_t end() const { return owned_.back().end; }
  size_t state_bytes() const;

 private:
  OptimConfig cfg_;
  std::vector<FlatRange> owned_;
  // Runs of the compact state (offsets into it) with the same weight-decay flag, in order.
  struct Run {
    size_t lo, hi;
    bool decay;
  };
  std::vector<Run> runs_;
  std::vector<float> m_, v_;
};

}  // namespace trellis
