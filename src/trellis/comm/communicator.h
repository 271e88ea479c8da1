#pragma once
// Collective and point-to-point communication over a group of ranks. Every blocking wait is
// bounded by a timeout; a timeout or a failure on any rank ends the whole job with a message that
// names the rank and the operation (DESIGN invariant 5).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trellis {

// Handle of an asynchronous operation. wait() returns when the operation completed; past the
// communicator's timeout it aborts the job naming the rank and the operation.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Non-blocking completion check; also drives progress of the communication library.
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank in MPI_COMM_WORLD (for messages).
  virtual int world_rank() const = 0;
  virtual std::string backend() const = 0;

  // In-place sum over all ranks.
  virtual std::unique_ptr<Work> all_reduce_async(float* buf, size_t n) = 0;
  // send holds size()*count floats; rank r receives the sum of block r into recv (count floats).
  virtual std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                                     size_t count) = 0;
  // send holds count floats; recv receives size()*count floats, block r from rank r.
  virtual std::unique_ptr<Work> all_gather_async(const float* send, float* recv, size_t count) = 0;
  // The same over 16-bit elements (bf16 bits), moved as they are: a mixed-precision run gathers
  // its bf16 working weights at half the bytes of fp32. A backend without it ends the job.
  virtual std::unique_ptr<Work> all_gather16_async(const uint16_t* send, uint16_t* recv,
                                                   size_t count) {
    (void)send, (void)recv, (void)count;
    abort("the " + backend() + " backend has no 16-bit all-gather", 1);
    return nullptr;
  }
  // Sums of bf16 values (the bits of gradients reduced as bf16, grad_reduce_dtype): each partial
  // sum is computed in fp32 from the widened operands and rounded to bf16 (nearest even), so a
  // sum over p ranks rounds p - 1 times; every rank gets the same bits. In place, and rank r's
  // block of a reduce-scatter (send: size()*count elements) into recv (count, apart from send).
  // A backend without them ends the job.
  virtual std::unique_ptr<Work> all_reduce_bf16_async(uint16_t* buf, size_t n) {
    (void)buf, (void)n;
    abort("the " + backend() + " backend has no bf16 all-reduce", 1);
    return nullptr;
  }
  virtual std::unique_ptr<Work> reduce_scatter_bf16_async(const uint16_t* send, uint16_t* recv,
                                                          size_t count) {
    (void)send, (void)recv, (void)count;
    abort("the " + backend() + " backend has no bf16 reduce-scatter", 1);
    return nullptr;
  }
  // An all-gather of blocks of different sizes: rank r sends counts[r] floats; recv receives
  // their sum, rank r's block after those of the ranks before it. A backend without it ends the
  // job.
  virtual std::unique_ptr<Work> all_gatherv_async(const float* send, float* recv,
                                                  const std::vector<size_t>& counts) {
    (void)send, (void)recv, (void)counts;
    abort("the " + backend() + " backend has no all-gather of uneven blocks", 1);
    return nullptr;
  }
  virtual std::unique_ptr<Work> broadcast_async(float* buf, size_t n, int root) = 0;
  virtual std::unique_ptr<Work> send_async(const float* buf, size_t n, int dst, int tag) = 0;
  virtual std::unique_ptr<Work> recv_async(float* buf, size_t n, int src, int tag) = 0;

  void all_reduce(float* buf, size_t n) { all_reduce_async(buf, n)->wait(); }
  // Sum of doubles (metrics, norms): small, blocking.
  virtual void all_reduce_sum(double* buf, size_t n) = 0;
  virtual void all_reduce_max(double* buf, size_t n) = 0;
  virtual void barrier() = 0;

  // Whether operations in flight move without the caller testing them (the MPI backend's progress
  // thread), so that polling between blocks would only contend with it.
  virtual bool progresses_by_itself() const { return false; }

  // Sub-communicator of the ranks with the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Ends the job on every rank: prints "trellis: error: rank R: MSG" and exits with `code`.
  [[noreturn]] virtual void abort(const std::string& msg, int code) = 0;

  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // Name used in error messages ("world", "dp", "tp", "pp").
  void set_name(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }

 protected:
  double timeout_s_ = 300.0;
  std::string name_ = "world";
};

// Floats a reduce-scatter of `count` floats per rank over `ranks` ranks holds beyond its output
// while it runs: the MPI backend's ring receives every other round into a scratch block of the
// output's size, needed from 3 ranks on (the local backend, one rank, holds none). ZeRO's memory
// prediction asks this instead of restating the backend.
inline size_t reduce_scatter_scratch_floats(int ranks, size_t count) {
  return ranks > 2 ? count : 0;
}

// World communicator: MPI when the process was started by mpirun/srun (and MPI support is built),
// otherwise the local single-rank backend.
std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv);
// Single-process backend (size 1): collectives are copies, p2p is an error.
std::unique_ptr<Communicator> make_local_communicator();
// Called once at the end of main (MPI_Finalize when MPI was initialised).
void finalize_communication();

}  // namespace trellis
