#pragma once
// `trellis calibrate`: this machine as a planner machine file, measured in seconds: the GEMM
// rate per rank (fp32, bf16) at the run's thread count, the memory bandwidth of a large copy,
// and, under mpirun, all-reduce latency and bandwidth between the ranks (one host: both links
// get the same measurement).
#include "nlohmann/json.hpp"

namespace trellis {

class Communicator;

// Collective: every rank of `world` calls it. `seconds` bounds each measurement.
nlohmann::json calibrate_machine(Communicator& world, int gemm_size, double seconds);

}  // namespace trellis
