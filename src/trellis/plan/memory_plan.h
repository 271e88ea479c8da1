#pragma once
// The analytic memory of a training run, per rank, from its sizes alone (`trellis train
// --dry-run`; the planner's memory model): parameters, gradients, optimizer state, ZeRO's compact
// shards and temporary buffers, and activations (model/activation_memory: the Contexts a rank's
// schedule keeps alive at once, plus each model chunk's workspace). It sums the sizing functions the
// runtime allocates by (rank_chunks, activation_layout, zero_footprint, Optimizer::state_tensors);
// the metrics' allocator high-water mark (alloc_peak_bytes) is checked against it.
#include <cstdint>
#include <string>
#include <vector>

#include "trellis/core/tensor.h"
#include "trellis/model/config.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/pipeline/schedule.h"
#include "trellis/plan/run_shape.h"

namespace trellis {

struct RankMemory {
  int rank = 0, dp_rank = 0, tp_rank = 0, pp_rank = 0;
  // Model states, as the ZeRO paper counts them (parallel/zero.h ZeroFootprint): what persists
  // from step to step.
  int64_t params = 0, grads = 0, optimizer = 0, shards = 0;
  int64_t weight_copies = 0;  // bf16: the chunks' bf16 copies of their weights
  int64_t buffers = 0;        // ZeRO's temporary buffers: gradient windows, gathers, staging
  int64_t activations = 0;    // Contexts alive at the schedule's peak
  int64_t workspace = 0;      // the model chunks' shared scratch
  int contexts = 0;           // that peak
  int64_t model_states() const { return params + grads + optimizer + shards + weight_copies; }
  int64_t total() const { return model_states() + buffers + activations + workspace; }
};

// The model chunks of pipeline rank pp_rank (local chunk v is global chunk v * pp + pp_rank, as
// the interleaved schedule places them; the first holds the embedding, the last the head) and
// their union, the rank's stage. The trainer builds its chunks from this too.
struct RankChunks {
  StageSpec stage;
  std::vector<StageSpec> chunks;
};
RankChunks rank_chunks(const ModelConfig& model, int pp, int virtual_stages,
                       const std::vector<int>& layer_split, int pp_rank);

// Every rank of the layout (world = dp * tp * pp), in world-rank order (TP fastest, then DP,
// then PP, as parallel/mesh).
std::vector<RankMemory> predict_memory(const RunShape& run);
// One rank of it (the planner asks for a few ranks of layouts with thousands).
RankMemory predict_rank_memory(const RunShape& run, int pp_rank, int dp_rank, int tp_rank);

// Micro-batch Contexts each local chunk holds at once under a pipeline rank's schedule `ops` (the
// Pipeline's pool): the most alive between a forward and its backward.
std::vector<int> peak_contexts(const std::vector<PipeOp>& ops, int virtual_stages);

}  // namespace trellis
