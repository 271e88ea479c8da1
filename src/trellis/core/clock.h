#pragma once
// Wall time for the step breakdown (compute, exposed communication, checkpoint stalls).
#include <chrono>

namespace trellis {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace trellis
