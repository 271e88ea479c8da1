// Single-process backend (world size 1) and the choice of the world communicator. This file is
// built with and without MPI; everything that touches MPI lives in comm/mpi_*.cpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"

namespace trellis {

#ifdef TRELLIS_WITH_MPI
namespace detail {
// Defined in comm/mpi_backend.cpp.
bool launched_by_mpi();
std::unique_ptr<Communicator> make_mpi_world_communicator(int* argc, char*** argv);
void finalize_mpi();
}  // namespace detail
#endif

namespace {

// With one rank every operation completes at launch.
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

std::unique_ptr<Work> done() { return std::make_unique<DoneWork>(); }

// Copies n floats; the regions may overlap (callers may pass send == recv).
void copy_floats(float* dst, const float* src, size_t n) {
  if (n > 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
}

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int world_rank() const override { return 0; }
  std::string backend() const override { return "local"; }

  std::unique_ptr<Work> all_reduce_async(float*, size_t) override { return done(); }
  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             size_t count) override {
    copy_floats(recv, send, count);
    return done();
  }
  std::unique_ptr<Work> all_gather_async(const float* send, float* recv, size_t count) override {
    copy_floats(recv, send, count);
    return done();
  }
  std::unique_ptr<Work> all_gather16_async(const uint16_t* send, uint16_t* recv,
                                           size_t count) override {
    if (count > 0 && recv != send) std::memmove(recv, send, count * sizeof(uint16_t));
    return done();
  }
  std::unique_ptr<Work> all_reduce_bf16_async(uint16_t*, size_t) override { return done(); }
  std::unique_ptr<Work> reduce_scatter_bf16_async(const uint16_t* send, uint16_t* recv,
                                                  size_t count) override {
    if (count > 0) std::memcpy(recv, send, count * sizeof(uint16_t));
    return done();
  }
  std::unique_ptr<Work> all_gatherv_async(const float* send, float* recv,
                                          const std::vector<size_t>& counts) override {
    copy_floats(recv, send, counts.at(0));
    return done();
  }
  std::unique_ptr<Work> broadcast_async(float*, size_t n, int root) override {
    TRELLIS_CHECK(root == 0, "broadcast of {} floats from root {} on a communicator of size 1", n,
                  root);
    return done();
  }
  std::unique_ptr<Work> send_async(const float*, size_t n, int dst, int tag) override {
    TRELLIS_CHECK(false, "send of {} floats to rank {} (tag {}) on the single-rank communicator {}",
                  n, dst, tag, name_);
  }
  std::unique_ptr<Work> recv_async(float*, size_t n, int src, int tag) override {
    TRELLIS_CHECK(false,
                  "recv of {} floats from rank {} (tag {}) on the single-rank communicator {}", n,
                  src, tag, name_);
  }
  void all_reduce_sum(double*, size_t) override {}
  void all_reduce_max(double*, size_t) override {}
  void barrier() override {}

  std::unique_ptr<Communicator> split(int, int) override {
    auto c = std::make_unique<LocalCommunicator>();
    c->set_timeout(timeout_s_);
    c->set_name(name_);
    return c;
  }

  [[noreturn]] void abort(const std::string& msg, int code) override {
    std::fflush(stdout);
    std::fprintf(stderr, "trellis: error: %s\n", msg.c_str());
    std::fflush(stderr);
    std::_Exit(code);
  }
};

// World size announced by a launcher, or 0 when there is none.
[[maybe_unused]] int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

// Tasks of the Slurm job step this process belongs to (0 outside srun).
int slurm_step_tasks() {
  const char* v = std::getenv("SLURM_STEP_NUM_TASKS");
  return v ? std::atoi(v) : 0;
}

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv) {
#ifdef TRELLIS_WITH_MPI
  if (detail::launched_by_mpi()) return detail::make_mpi_world_communicator(argc, argv);
  // srun without an MPI plugin (Slurm's default MpiDefault=none) gives its tasks no PMI: each
  // would train alone on the whole problem, all of them into one output directory.
  TRELLIS_REQUIRE(slurm_step_tasks() <= 1,
                  "srun started {} tasks without an MPI bootstrap (no PMIx/PMI variables), so "
                  "each would train alone: run srun --mpi=pmix (or set MpiDefault=pmix in "
                  "slurm.conf); `trellis launch --launcher srun` passes --mpi=pmix itself",
                  slurm_step_tasks());
#else
  (void)argc;
  (void)argv;
  // Without MPI every rank would silently train alone on the whole problem.
  const int launched = std::max(launcher_world_size(), slurm_step_tasks());
  TRELLIS_REQUIRE(launched <= 1,
                  "started by an MPI launcher with {} ranks, but this trellis was built without "
                  "MPI (configure with -DTRELLIS_WITH_MPI=ON)",
                  launched);
#endif
  return make_local_communicator();
}

void finalize_communication() {
#ifdef TRELLIS_WITH_MPI
  detail::finalize_mpi();
#endif
}

}  // namespace trellis
