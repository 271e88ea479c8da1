#pragma once
// The training loop: data-parallel over the mesh's DP axis, gradient accumulation, clipping,
// optimizer (optionally ZeRO-1 sharded), validation, metrics, checkpoints, resume.
#include "trellis/train/config.h"

namespace trellis {

class Communicator;

// Runs `cfg` on this rank. Returns 0 on success.
int run_training(TrainConfig cfg, Communicator& world);

}  // namespace trellis
