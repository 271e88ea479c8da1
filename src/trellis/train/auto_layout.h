#pragma once
// `train --layout auto`: the planner's first choice (plan/planner) for this run's model, batch,
// sequence length and world, on a machine file (`--machine`) or on this machine calibrated at
// start (plan/calibrate, about two seconds).
#include <cstdint>

#include "trellis/train/config.h"
#include "trellis/train/run_data.h"

namespace trellis {

class Communicator;

// Collective. Returns cfg with dp, tp, pp, schedule, virtual stages, ZeRO, recompute, sequence
// parallelism and micro-batch set to the plan's first layout, chosen on rank 0 and broadcast
// (each rank's own calibration differs a little), for data's model and sequence length (the
// run's data, loaded once). Input errors: any of those also given, or no layout that fits (with
// the smallest world that would). The choice then goes through validate_run like any layout.
TrainConfig choose_auto_layout(TrainConfig cfg, const RunData& data, Communicator& world);

}  // namespace trellis
