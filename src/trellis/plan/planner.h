#pragma once
// `trellis plan`: every valid layout of a run on a described machine (dp, tp dividing the heads,
// pp dividing the blocks, virtual stages, schedule, ZeRO stage where trellis allows it,
// recompute, sequence parallelism, micro-batch dividing the per-rank batch), each with its
// predicted memory (plan/memory_plan: trellis's own allocations, fp32 activations) and step
// time (plan/cost_model), those that fit the device ranked by tokens/s.
#include <cstdint>
#include <string>
#include <vector>

#include "trellis/plan/cost_model.h"
#include "trellis/plan/machine.h"
#include "trellis/plan/memory_plan.h"

namespace trellis {

struct PlanRequest {
  ModelConfig model;
  int world = 1, ranks_per_node = 1;
  int64_t batch = 1;  // sequences per step, all data-parallel ranks together
  int64_t seq_len = 1;
  std::string precision = "bf16";
  std::string optimizer = "adamw";
  bool bf16_grad_reduce = false;  // grad_reduce_dtype = bf16
};

struct Candidate {
  Layout layout;
  StepCost cost;
  RankMemory memory;  // the rank that needs the most
  bool fits = false;
  std::string loses;  // why it is slower than the first (empty for the first)
};

struct Plan {
  std::vector<Candidate> candidates;  // fitting ones first, by tokens/s; then the rest by memory
  int64_t fitting = 0;
  // When nothing fits: the smallest world size (same batch, node size) where a layout fits,
  // that layout and its memory; 0 when none up to 65,536 ranks does.
  int smallest_world = 0;
  Candidate smallest;
};

// Every layout of the request that trellis can run (schedule and ZeRO restrictions applied).
std::vector<Layout> enumerate_layouts(const ModelConfig& model, int world, int64_t batch);

// The worst rank's memory of a layout (every pipeline stage, data- and tensor-parallel rank 0).
// Input error for a layout the trainer refuses (check_run_shape).
RankMemory layout_memory(const PlanRequest& req, const Layout& layout);

Plan make_plan(const PlanRequest& req, const Machine& machine);

// The largest step-time term by which `c` loses to `best`, in words.
std::string why_slower(const Candidate& c, const Candidate& best);

}  // namespace trellis
