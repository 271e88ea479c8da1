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
  float min_lr = 6e-5f;   // cosine and linear decay to this
  int warmup_steps = -1;  // -1 = auto: 10% of the run's steps, at most 2000 (warmup_steps_for)
  std::string lr_schedule = "cosine";  // cosine | linear | constant | inverse_sqrt
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float momentum = 0.9f;   // sgd
  float grad_clip = 1.0f;  // global-norm clip; 0 disables
};

// The schedules after warmup (a linear ramp from 0 to lr over the warmup steps):
//   cosine        from lr down to min_lr at total_steps (half a cosine wave);
//   linear        from lr down to min_lr at total_steps;
//   constant      lr;
//   inverse_sqrt  lr * sqrt(warmup / step): the Transformer paper's d^-0.5 * min(step^-0.5,
//                 step * warmup^-1.5), scaled so its peak at the end of warmup is lr (no floor).
enum class LrSchedule : uint8_t { Cosine, Linear, Constant, InverseSqrt };
// Input error naming the key for an unknown name.
LrSchedule parse_lr_schedule(const std::string& name);
// The warmup a run of total_steps gets: warmup_steps, or with -1 a tenth of the steps (at least
// 1, at most 2000: GPT-2's and Megatron's usual warmup on long runs).
int64_t warmup_steps_for(const OptimConfig& c, int64_t total_steps);
// The learning rate of 1-based step `step` of a run of total_steps.
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
  // The same from gradients kept as bf16 bits (ZeRO-0's bf16 storage), widened as they are read.
  void step_compact(float* params, const uint16_t* grads, float lr, int64_t step,
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
  // Float tensors of state an optimizer of this name keeps per owned parameter (adamw 2: exp_avg
  // and exp_avg_sq; sgd 1: momentum_buffer); the memory plan asks this too.
  static int state_tensors(const std::string& name);

 private:
  // step_compact's sweep over either kind of gradient (one of g32, g16 is null).
  void sweep(float* params, const float* g32, const uint16_t* g16, float lr, int64_t step,
             float grad_mul);

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
