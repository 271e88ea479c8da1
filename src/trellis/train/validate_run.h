#pragma once
// A training run's shape, validated once: the world over dp x tp x pp, the batch over the
// data-parallel ranks and micro-batches, and every rule of plan/run_shape (schedule, ZeRO, sequence
// parallelism, the model over tp and pp). The trainer, `train --dry-run` and `--layout auto`'s
// choice all pass through it; `trellis plan` checks its candidates with the same check_run_shape.
#include <string>
#include <vector>

#include "trellis/train/config.h"
#include "trellis/train/run_data.h"

namespace trellis {

struct RunShape;  // plan/run_shape.h: plan is below train, and only train's sources include it

// cfg's layout on world_size ranks (dp = 0: the rest of the world) for data's model and
// sequence length. compute is this rank's choice of precision; the trainer then takes bf16 only
// if every rank can. Input error naming the first rule cfg breaks.
RunShape validate_run(const TrainConfig& cfg, int world_size, const RunData& data);

// "3,1,2" -> {3, 1, 2}; input error for anything but positive counts.
std::vector<int> parse_layer_split(const std::string& text);

}  // namespace trellis
