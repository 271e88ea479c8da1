// All-reduce bus bandwidth: the trellis communicator (non-blocking MPI_Iallreduce + bounded poll
// loop) against a plain blocking MPI_Allreduce in the same run, so the ratio shows what the
// timeout machinery costs. A third column, MPI_Iallreduce + MPI_Wait, separates the cost of the
// non-blocking algorithm (OpenMPI's libnbc) from the cost of trellis' poll loop. Bus bandwidth =
// bytes * 2 (p - 1) / p / time (the NCCL-tests convention: comparable across rank counts).
//
//   mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 allreduce_bench [--reps R]
//
// Each size: 2 warm-up runs, then R timed runs (default 9), each preceded by a barrier; a run's
// time is the slowest rank's; the table shows the median. ratio = mpi_us / trellis_us.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef TRELLIS_WITH_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"

using namespace trellis;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over reps of the slowest rank's time for one call of fn.
template <typename F>
double median_seconds(Communicator& comm, int reps, F&& fn) {
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> t(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    const double t0 = now();
    fn();
    t[static_cast<size_t>(i)] = now() - t0;
  }
  comm.all_reduce_max(t.data(), t.size());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string human_bytes(size_t b) {
  if (b >= (1u << 20)) return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: allreduce_bench [--reps R]\n");
      return 2;
    }
  }
  try {
    auto comm = make_world_communicator(&argc, &argv);
    const int p = comm->size();
    const double bus = p > 1 ? 2.0 * (p - 1) / p : 1.0;
    if (comm->rank() == 0) {
      std::printf("# all_reduce (float sum), %d ranks, %s backend, median of %d\n", p,
                  comm->backend().c_str(), reps);
      std::printf("%9s %11s %12s %11s %12s %11s %12s %7s\n", "size", "trellis_us", "trellis_GB/s",
                  "mpi_us", "mpi_GB/s", "mpi_nb_us", "mpi_nb_GB/s", "ratio");
    }
    for (size_t bytes = 1024; bytes <= (size_t{64} << 20); bytes *= 4) {
      const size_t n = bytes / sizeof(float);
      std::vector<float> buf(n, 1.0f / 1024);
      const double tt = median_seconds(*comm, reps, [&] { comm->all_reduce(buf.data(), n); });
      double tm = 0.0, tn = 0.0;
#ifdef TRELLIS_WITH_MPI
      int mpi_up = 0;
      MPI_Initialized(&mpi_up);
      if (mpi_up)
        tm = median_seconds(*comm, reps, [&] {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        });
      if (mpi_up)
        tn = median_seconds(*comm, reps, [&] {
          MPI_Request r;
          MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
        });
#endif
      if (comm->rank() == 0) {
        const double gt = bytes * bus / tt / 1e9;
        if (tm > 0) {
          const double gm = bytes * bus / tm / 1e9;
          const double gn = bytes * bus / tn / 1e9;
          std::printf("%9s %11.1f %12.3f %11.1f %12.3f %11.1f %12.3f %7.2f\n",
                      human_bytes(bytes).c_str(), tt * 1e6, gt, tm * 1e6, gm, tn * 1e6, gn,
                      tm / tt);
        } else {
          std::printf("%9s %11.1f %12.3f %11s %12s %11s %12s %7s\n", human_bytes(bytes).c_str(),
                      tt * 1e6, gt, "-", "-", "-", "-", "-");
        }
        std::fflush(stdout);
      }
    }
    comm.reset();
    finalize_communication();
  } catch (const Error& e) {
    std::fprintf(stderr, "trellis: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
