#pragma once
// Threads per rank when the user gives none: this node's cores shared evenly by the ranks the
// launcher put on it (mpirun's or Slurm's local size), as training and calibration both assume.
#include <algorithm>
#include <cstdlib>
#include <thread>

namespace trellis {

inline int default_threads_per_rank() {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
  const int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
  return std::max(1, hw / ranks_here);
}

}  // namespace trellis
