#pragma once
// The planner's analytic model of one training step on a described machine: the FLOPs of every
// chunk's forward and backward per micro-batch (from the model's GEMM shapes, plus what the
// recompute policy runs again), the memory-bound ops at the device's memory bandwidth, the
// tensor-parallel collectives inside each block, the pipeline's sends, the data-parallel
// gradient sync (ZeRO), and the pipeline bubble found by playing each rank's exact op list
// (parallel/pipeline/schedule) against the others. Also the published closed forms the tests
// compare with: ZeRO's model-state bytes and Korthikanti et al.'s activation bytes per layer.
#include <cstdint>
#include <string>

#include "trellis/model/config.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/pipeline/schedule.h"
#include "trellis/plan/machine.h"

namespace trellis {

// Bytes per parameter of the model states. trellis: fp32 weights, fp32 gradients, AdamW's two
// fp32 moments (4 + 4 + 8). Mixed-precision Adam as in the ZeRO paper: fp16 weights and
// gradients, and K = 12 bytes of fp32 master weights, momentum and variance (2 + 2 + 12).
struct StateBytes {
  double params = 4, grads = 4, optimizer = 8;
  static StateBytes trellis_adamw() { return {4, 4, 8}; }
  static StateBytes mixed_precision_adam() { return {2, 2, 12}; }
};

// Model-state bytes per device for n_params parameters over dp data-parallel ranks under ZeRO
// stage 0-3 (Rajbhandari et al. 2020, Sec. 5 / Fig. 1): stage 1 shards the optimizer state,
// 2 also the gradients, 3 also the parameters.
double model_state_bytes(double n_params, int dp, int zero, StateBytes bytes);

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
// Sec. 4, Table 2): activation bytes per transformer layer kept for backward, fp16 with 1-byte
// dropout masks: s sequence, b micro-batch, h width, a heads, t tensor-parallel size.
//   none: sbh(34 + 5as/h) at t = 1; TP: sbh(10 + 24/t + 5as/(ht)); TP+SP: sbh(34/t + 5as/(ht));
//   selective (with SP): 34sbh/t (without SP: sbh(10 + 24/t)); full: 2sbh (the layer's input).
double megatron_activation_per_layer(double s, double b, double h, double a, double t,
                                     bool sequence_parallel, Recompute recompute);

// One parallel layout of a run.
struct Layout {
  int dp = 1, tp = 1, pp = 1, virtual_stages = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int zero = 0;
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  int64_t micro_batch = 1;  // sequences per micro-batch
  int64_t accum = 1;        // micro-batches per step per data-parallel rank
  int world() const { return dp * tp * pp; }
  std::string describe() const;
};

// Whose kernels and communication the model describes. Trellis: fp32 activations and
// tensor-parallel/pipeline traffic, fp32 gradient sync, trellis's selective policy (attention and
// the MLP's up projection) and full policy (reruns the forward's collectives except the MLP's),
// without a pipeline the data-parallel collectives of ZeRO-0/2/3 overlapped with the passes
// (the progress thread), ZeRO-1's after backward.
// Megatron: Megatron-LM as in Narayanan et al. 2021: fp16 activations and traffic, fp16 gradient
// all-reduce after the step's backward (not overlapped), pipeline sends divided by t
// (scatter/gather), full recompute reruns both of a block's collectives.
enum class Engine { Trellis, Megatron };

struct StepCost {
  double step_s = 0;
  double compute_s = 0;        // GEMMs and memory-bound ops of the busiest rank, recompute included
  double recompute_s = 0;      // ... of which recomputation
  double tp_comm_s = 0;        // tensor-parallel collectives of the busiest rank (not overlapped)
  double pp_comm_s = 0;        // what the pipeline's sends add to the step
  double bubble_s = 0;         // the busiest rank's idle time in the schedule without sends
  double dp_comm_s = 0;        // data-parallel gradient sync (ZeRO gathers included), exposed
  double dp_comm_total_s = 0;  // ... before overlap
  double optimizer_s = 0;
  double page_refill_s = 0;    // ZeRO-2/3: writing released pages again (page faults)
  double model_flops = 0;     // per step, all ranks: forward + backward, no recompute
  double hardware_flops = 0;  // ... with recompute
  double tokens_per_s = 0;
  double mfu = 0, hfu = 0;  // model / hardware FLOPs per second over the world's peak
};

struct CostInputs {
  ModelConfig model;
  Layout layout;
  int64_t seq_len = 1;
  int ranks_per_node = 1;
  std::string precision = "bf16";  // fp32 | tf32 | bf16: the GEMMs' peak
  Engine engine = Engine::Trellis;
  bool bf16_grad_reduce = false;  // grad_reduce_dtype = bf16: half the gradients' wire bytes
};

// Throws an input error for a layout the schedule refuses.
StepCost predict_step(const CostInputs& in, const Machine& machine);

// The step time of a pipeline whose every chunk takes fwd_s forward and bwd_s backward (of which
// weight_s is the weight-gradient part a split backward runs apart), from the ranks' op lists
// alone (no sends): what the planner's replay gives for a uniform model.
double pipeline_makespan(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                         double fwd_s, double bwd_s, double weight_s = 0);

// Forward FLOPs of one block for one micro-batch of b sequences of s tokens on one of tp ranks
// (GEMMs and attention's two batched products; decoder: with cross-attention).
double block_forward_flops(const ModelConfig& cfg, bool decoder, double b, double s, int tp);

// The bytes the planner charges one block's memory-bound ops (norms, biases, activation
// functions, residual sums) per micro-batch: twice what the block keeps for backward in the
// forward, four times in the backward (an assumption; `trellis calibrate` measures the rate that
// makes it hold for a GPT-2 block). What attention saves (its logsumexp) is left out: the
// attention kernels' own rate covers it.
double block_memory_bound_bytes(const ModelConfig& cfg, bool decoder, int64_t b, int64_t s,
                                int tp, bool sequence_parallel);

}  // namespace trellis
