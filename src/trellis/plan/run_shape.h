#pragma once
// The shape of a training run: its model, layout, batch split and precision, everything the
// memory plan, the planner and the trainer size by. train/validate_run makes one from a
// TrainConfig; the planner makes one per candidate layout; check_run_shape is the one place that
// says which shapes trellis runs.
#include <cstdint>
#include <string>
#include <vector>

#include "trellis/core/tensor.h"
#include "trellis/model/config.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/data_parallel.h"
#include "trellis/parallel/pipeline/schedule.h"

namespace trellis {

struct RunShape {
  ModelConfig model;
  int dp = 1, tp = 1, pp = 1, virtual_stages = 1, zero = 0;
  bool sequence_parallel = false;  // only with tp > 1
  Recompute recompute = Recompute::None;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  std::vector<int> layer_split;  // empty: balanced
  int64_t micro_batch = 1, seq_len = 1, accum = 1;
  std::string optimizer = "adamw";
  DType compute = DType::F32;
  GradReduceDtype grad_dtype = GradReduceDtype::Fp32;  // grad_reduce_dtype
};

// Input error, with the message the user acts on, unless trellis can run `run`: virtual stages
// and schedule, the ZeRO stage and ZeRO with a pipeline, seq_len under sequence parallelism, the
// blocks over the pipeline chunks (layer_split), the schedule's micro-batches, and the heads,
// key/value heads and MLP width over tp. The last three are the runtime's own preconditions
// (rank_chunks, build_schedule, ParamLayout), asked once here so a run fails before any work.
void check_run_shape(const RunShape& run);

}  // namespace trellis
