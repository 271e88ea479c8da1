#pragma once
// The training loop: data-parallel over the mesh's DP axis, gradient accumulation, clipping,
// optimizer (optionally ZeRO-1/2/3 sharded), validation, metrics, checkpoints, resume.
#include "trellis/train/config.h"

namespace trellis {

class Communicator;

// Runs `cfg` on this rank. Returns 0 on success.
int run_training(TrainConfig cfg, Communicator& world);
// `train --dry-run`: prints the predicted memory of every rank of cfg's layout (plan/memory_plan;
// JSON with json) without training. One process, any layout.
int dry_run(const TrainConfig& cfg, bool json);

}  // namespace trellis
