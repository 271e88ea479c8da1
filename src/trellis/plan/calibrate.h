#pragma once
// `trellis calibrate`: this machine as a planner machine file, measured in seconds with
// trellis's own kernels at the run's threads per rank: a per-shape GEMM fit per precision, the
// attention and memory-bound kernels' rates, copy and page-refill bandwidth, and, under mpirun,
// a ring fit of each collective between the ranks (one host: both links get the same).
#include <array>
#include <vector>

#include "nlohmann/json.hpp"
#include "trellis/plan/machine.h"

namespace trellis {

class Communicator;

// Collective: every rank of `world` calls it. `seconds` bounds each measurement; the compute
// measurements run `rounds` times, interleaved, and keep the median.
nlohmann::json calibrate_machine(Communicator& world, int gemm_size, double seconds,
                                 int rounds);

// The GEMM fit from measured rows {2MNK, MK + KN + MN, 1, seconds}: least squares of relative
// errors, leaving out a term that would come out negative.
GemmFit fit_gemm(const std::vector<std::array<double, 4>>& rows);

}  // namespace trellis
