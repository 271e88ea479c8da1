#pragma once
// Wall time for the step breakdown (compute, exposed communication, checkpoint stalls).
#include <chrono>

namespace trellis {

using Clock = std::chrono::steady_clock;

// Taken when the program is loaded (static initialisation, before main): time since it counts all
// of start-up, MPI and data included (time_budget's clock).
inline const Clock::time_point kProcessStart = Clock::now();

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace trellis
