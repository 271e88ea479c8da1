#pragma once
// `trellis calibrate`: this machine as a planner machine file, measured in seconds with
// trellis's own kernels at the run's threads per rank: a per-shape GEMM fit per precision, the
// attention and memory-bound kernels' rates, copy and page-refill bandwidth, and, under mpirun,
// a ring fit of each collective between the ranks (one host: both links get the same).
#include <array>
#include <functional>
#include <vector>

#include "nlohmann/json.hpp"
#include "trellis/plan/machine.h"

namespace trellis {

class Communicator;
struct Backend;

// Collective: every rank of `world` calls it. `seconds` bounds each measurement; the compute
// measurements run `rounds` times, interleaved, and each kernel keeps its fastest round.
nlohmann::json calibrate_machine(Communicator& world, int gemm_size, double seconds,
                                 int rounds);

// Seconds per call of f on a shared machine: the fastest of `windows` timing windows of
// seconds / windows each (each at least one call, after an untimed one; a call longer than a
// window is a window itself). Another job only ever slows a window, so however many windows it
// hits, one it missed gives the kernel's own speed. `now` reads a clock in seconds (default:
// steady_clock; tests pass a fake one).
double time_per_call(const std::function<void()>& f, double seconds, int windows = 5,
                     const std::function<double()>& now = {});

// The CPU kernels with every GEMM and attention kernel a no-op: a model run with them does
// only its memory-bound work (norms, biases, activations, residuals, copies), which is what the
// memory-bound rate is timed on. Every GEMM entry of Backend must be here.
const Backend& memory_bound_kernels();

// The smallest of samples (seconds): the fastest round of a measurement.
double fastest_of(const std::vector<double>& samples);

// The GEMM fit from measured rows {2MNK, MK + KN + MN, 1, seconds}: least squares of relative
// errors, leaving out a term that would come out negative.
GemmFit fit_gemm(const std::vector<std::array<double, 4>>& rows);

}  // namespace trellis
