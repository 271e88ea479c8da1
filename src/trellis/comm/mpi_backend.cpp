// MPI backend (C API). Every operation is non-blocking underneath; waits poll MPI_Testall so
// that they can give up after the communicator's timeout and end the whole job with a message
// that names the rank and the operation (DESIGN invariant 5). Errors are returned, not fatal
// (MPI_ERRORS_RETURN), and turned into the same kind of message.
// A progress thread (ProgressThread below) keeps operations moving while the caller computes.
// The C API only: the target links MPI::MPI_C, not OpenMPI's deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <malloc.h>
#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/core/bf16.h"

namespace trellis {
namespace detail {

namespace {

using Clock = std::chrono::steady_clock;

bool g_initialized_here = false;
// Largest element count of one MPI request. MPI counts are int; larger buffers are cut into
// several requests. TRELLIS_MPI_MAX_CHUNK lowers it so tests can exercise the chunked paths.
size_t g_max_chunk = static_cast<size_t>(INT_MAX);
// TRELLIS_MPI_NO_RING takes MPI's own reduce-scatter in place of the ring, as an MPI whose
// MPI_TAG_UB leaves the ring no tags does, so that tests reach that path.
bool g_ring_allowed = true;
// TRELLIS_CHECK_COLLECTIVES=1: before each collective every member shows the others what it is
// about to issue (one small all-gather), and a mismatch ends the job naming both sides, where
// MPI would hang, truncate or crash (a debugging aid: it doubles the collectives' latency).
bool g_check_collectives = false;

// What an operation was, for messages: "all_reduce #12 (1000 floats)".
struct OpInfo {
  const char* op = "";
  uint64_t seq = 0;
  size_t n = 0;
  const char* unit = "floats";
  int peer = -1;  // p2p peer or broadcast root
  int tag = -1;
};

std::string describe(const OpInfo& info) {
  std::string s = fmt::format("{} #{} ({} {}", info.op, info.seq, info.n, info.unit);
  if (std::strcmp(info.op, "send") == 0)
    s += fmt::format(" to rank {}, tag {}", info.peer, info.tag);
  if (std::strcmp(info.op, "recv") == 0)
    s += fmt::format(" from rank {}, tag {}", info.peer, info.tag);
  if (std::strcmp(info.op, "broadcast") == 0) s += fmt::format(" from root {}", info.peer);
  return s + ")";
}

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<size_t>(len));
}

// The sum of bf16 elements (MPI_UINT16_T bits) as Communicator's bf16 reductions define it:
// widened, added in fp32, rounded once.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = round_bf16(widen_bf16(a[i]) + widen_bf16(b[i]));
}
void add_bf16(uint16_t* sum, const uint16_t* own, size_t n) {
  for (size_t i = 0; i < n; ++i)
    sum[i] = round_bf16(widen_bf16(sum[i]) + widen_bf16(own[i]));
}
void add_floats(float* sum, const float* own, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += own[i];
}
// Created on first use (after MPI_Init), freed by MPI_Finalize.
MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&bf16_sum, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

// Calls f(offset, count) for consecutive pieces of [0, n) of at most g_max_chunk elements.
template <typename F>
void for_chunks(size_t n, F&& f) {
  for (size_t off = 0; off < n; off += g_max_chunk)
    f(off, static_cast<int>(std::min(g_max_chunk, n - off)));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

bool mpi_finalized() {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

// MPI moves a non-blocking operation only while some thread of the process is inside MPI: the
// rounds of a non-blocking collective (libnbc) and the fragments of a large TCP message each need
// a progress call. A rank that computes between its tests would leave a collective waiting until
// the next block boundary, or until wait() (issue 27: 95% of a 1 Gbit/s all-reduce stayed
// exposed). So, where MPI grants MPI_THREAD_MULTIPLE, this thread enters MPI's progress engine
// every `poll_us` while any operation is in flight and no caller is already polling in wait(),
// and sleeps on a condition otherwise. It enters through MPI_Iprobe on a private communicator
// (of this rank alone) that carries no messages: it touches no request, so the caller's own
// MPI_Test calls and this thread never race over a handle, and a completed operation is still seen
// by its caller only. (bench/progress_bench.cpp measured the other candidate, a thread that owns
// every MPI call: it hid as much, but each blocking 1 KiB collective paid a hand-off between
// threads, 3-30x slower on 2 loaded cores: bench/RESULTS.md, "Communication that progresses during
// compute".)
class ProgressThread {
 public:
  ~ProgressThread() { stop(); }

  // After MPI_Init_thread granted MPI_THREAD_MULTIPLE.
  void start(long poll_us) {
    if (thread_.joinable() || poll_us <= 0) return;
    // A duplicate of MPI_COMM_SELF: no other rank takes part, so ranks that differ in
    // TRELLIS_MPI_PROGRESS_US cannot mismatch a collective over it.
    if (MPI_Comm_dup(MPI_COMM_SELF, &probe_) != MPI_SUCCESS) return;  // no thread, no harm
    poll_us_ = poll_us;
    stop_ = false;
    thread_ = std::thread([this] { loop(); });
  }
  // Before MPI_Finalize (and at exit): the thread leaves MPI and joins.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    if (!mpi_finalized()) MPI_Comm_free(&probe_);
    probe_ = MPI_COMM_NULL;
  }
  bool running() const { return thread_.joinable(); }

  // An operation went in flight / completed (or was abandoned).
  void add() {
    if (!running()) return;
    if (pending_.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lock(mu_);  // the waiter checks pending_ under mu_
      cv_.notify_one();
    }
  }
  void remove() {
    if (running()) pending_.fetch_sub(1);
  }
  // A caller polls inside wait(): it progresses everything in flight itself.
  void enter_wait() { waiting_.fetch_add(1, std::memory_order_relaxed); }
  void leave_wait() { waiting_.fetch_sub(1, std::memory_order_relaxed); }

 private:
  void loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || pending_.load() > 0; });
        if (stop_) return;
      }
      if (waiting_.load(std::memory_order_relaxed) == 0) {
        int flag = 0;
        // Errors surface in the caller's own MPI_Test of the operation; nothing to do here.
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, probe_, &flag, MPI_STATUS_IGNORE);
      }
      // Sleep, not spin: the rank's compute threads need the cores (2 here, shared by ranks).
      timespec ts{0, poll_us_ * 1000};
      nanosleep(&ts, nullptr);
    }
  }

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> pending_{0}, waiting_{0};
  long poll_us_ = 0;
  MPI_Comm probe_ = MPI_COMM_NULL;
};

ProgressThread g_progress;

class MpiCommunicator;

class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator& comm, OpInfo info) : comm_(comm), info_(info) {}
  ~MpiWork() override;
  void wait() override;
  bool test() override;
  const OpInfo& info() const { return info_; }

  std::vector<MPI_Request> reqs;
  std::vector<float> staging;         // copy of an input or output that aliases the other one
  std::vector<float> staging_in;      // a ring's second block buffer (more than 2 ranks)
  std::function<void()> on_complete;  // e.g. copies staging to the caller's output
  // An operation of several rounds: called when reqs have completed, it starts the next round
  // (new reqs) and returns true, or returns false when the operation is done.
  std::function<bool()> next_round;

  // Called once its first request is started: the progress thread moves it from then on.
  void mark_in_flight() {
    if (in_flight_) return;
    in_flight_ = true;
    g_progress.add();
  }

 private:
  void mark_done() {
    done_ = true;
    if (in_flight_) g_progress.remove();
    in_flight_ = false;
  }

  MpiCommunicator& comm_;
  OpInfo info_;
  bool done_ = false;
  bool in_flight_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", nullptr);
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", nullptr);
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", nullptr);
    check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank", nullptr);
    // The world ranks of the other members, for messages about a peer that stopped answering.
    MPI_Group group, world;
    check(MPI_Comm_group(comm_, &group), "MPI_Comm_group", nullptr);
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group", nullptr);
    std::vector<int> local(static_cast<size_t>(size_)), global(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) local[size_t(i)] = i;
    check(MPI_Group_translate_ranks(group, size_, local.data(), world, global.data()),
          "MPI_Group_translate_ranks", nullptr);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    for (int i = 0; i < size_; ++i)
      if (i != rank_) peers_.push_back(global[size_t(i)]);
    members_ = global;
    int* tag_ub = nullptr;
    int found = 0;
    // Cached on MPI_COMM_WORLD only (a split communicator has no such attribute in OpenMPI).
    check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found), "MPI_Comm_get_attr",
          nullptr);
    if (g_ring_allowed && found && *tag_ub > 32768 + 1024)
      ring_tags_ = std::min(*tag_ub - 32768, 1 << 20);
  }

  // "world rank 3" / "world ranks 1, 2, 3": the members a wait on this communicator depends on.
  std::string peers() const {
    return fmt::format("world rank{} {}", peers_.size() == 1 ? "" : "s", fmt::join(peers_, ", "));
  }
  ~MpiCommunicator() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank() const override { return world_rank_; }
  std::string backend() const override { return "mpi"; }
  bool progresses_by_itself() const override { return g_progress.running(); }

  // Aborts the job when an MPI call failed.
  void check(int rc, const char* call, const OpInfo* info) {
    if (rc == MPI_SUCCESS) return;
    std::string where = info ? fmt::format(" in {} on communicator {}", describe(*info), name_)
                             : fmt::format(" on communicator {}", name_);
    abort(fmt::format("{} failed{}: {}", call, where, mpi_error_string(rc)), 1);
  }

  std::unique_ptr<Work> all_reduce_async(float* buf, size_t n) override {
    auto w = start({"all_reduce", 0, n});
    for_chunks(n, [&](size_t off, int len) {
      MPI_Request r;
      launch(*w, MPI_Iallreduce(MPI_IN_PLACE, buf + off, len, MPI_FLOAT, MPI_SUM, comm_, &r),
             "MPI_Iallreduce", r);
    });
    return w;
  }

  std::unique_ptr<Work> all_reduce_bf16_async(uint16_t* buf, size_t n) override {
    auto w = start({"all_reduce", 0, n, "bf16 elements"});
    for_chunks(n, [&](size_t off, int len) {
      MPI_Request r;
      launch(*w,
             MPI_Iallreduce(MPI_IN_PLACE, buf + off, len, MPI_UINT16_T, bf16_sum_op(), comm_, &r),
             "MPI_Iallreduce", r);
    });
    return w;
  }

  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             size_t count) override {
    auto w = start({"reduce_scatter", 0, count});
    if (count == 0) return w;
    const size_t total = count * static_cast<size_t>(size_);
    float* out = recv;
    if (overlaps(send, total * sizeof(float), recv, count * sizeof(float))) {
      w->staging.resize(count);
      out = w->staging.data();
      MpiWork* raw = w.get();
      w->on_complete = [raw, recv, count] {
        std::memcpy(recv, raw->staging.data(), count * sizeof(float));
      };
    }
    launch_reduce_scatter(*w, send, out, count, MPI_FLOAT, MPI_SUM, add_floats);
    return w;
  }

  std::unique_ptr<Work> reduce_scatter_bf16_async(const uint16_t* send, uint16_t* recv,
                                                  size_t count) override {
    auto w = start({"reduce_scatter", 0, count, "bf16 elements"});
    if (count == 0) return w;
    const size_t total = count * static_cast<size_t>(size_);
    TRELLIS_CHECK(!overlaps(send, total * 2, recv, count * 2),
                  "bf16 reduce-scatter: the output overlaps the input");
    launch_reduce_scatter(*w, send, recv, count, MPI_UINT16_T, bf16_sum_op(), add_bf16);
    return w;
  }

  // Rank r's block of the sum of send (size_ blocks of count elements) into out: the ring where
  // it has tags and a block fits one request, else MPI's own reduce-scatter, else one reduce per
  // block and piece. add(sum, own, n) is the ring's sum, the same as op's.
  template <class T>
  void launch_reduce_scatter(MpiWork& w, const T* send, T* out, size_t count, MPI_Datatype type,
                             MPI_Op op, void (*add)(T*, const T*, size_t)) {
    if (count <= g_max_chunk && ring_tags_ > 0 && size_ > 1) {
      ring_reduce_scatter(w, send, out, count, type, add);
    } else if (count <= g_max_chunk) {
      MPI_Request r;
      launch(w,
             MPI_Ireduce_scatter_block(send, out, static_cast<int>(count), type, op, comm_, &r),
             "MPI_Ireduce_scatter_block", r);
    } else {
      // A block does not fit one request: reduce each block to its owner, piece by piece.
      for (int root = 0; root < size_; ++root) {
        const T* block = send + static_cast<size_t>(root) * count;
        for_chunks(count, [&](size_t off, int len) {
          MPI_Request r;
          launch(w,
                 MPI_Ireduce(block + off, root == rank_ ? out + off : nullptr, len, type, op, root,
                             comm_, &r),
                 "MPI_Ireduce", r);
        });
      }
    }
  }

  std::unique_ptr<Work> all_gather_async(const float* send, float* recv, size_t count) override {
    auto w = start({"all_gather", 0, count});
    if (count == 0) return w;
    const size_t total = count * static_cast<size_t>(size_);
    const float* mine = recv + static_cast<size_t>(rank_) * count;
    // In place (ZeRO: each rank updated its own slice of recv), or staged when overlapping.
    if (send != mine && overlaps(send, count * sizeof(float), recv, total * sizeof(float))) {
      w->staging.assign(send, send + count);
      send = w->staging.data();
    }
    launch_all_gather(*w, send, recv, count, MPI_FLOAT);
    return w;
  }

  std::unique_ptr<Work> all_gather16_async(const uint16_t* send, uint16_t* recv,
                                           size_t count) override {
    auto w = start({"all_gather", 0, count, "16-bit elements"});
    if (count == 0) return w;
    const size_t total = count * static_cast<size_t>(size_);
    const uint16_t* mine = recv + static_cast<size_t>(rank_) * count;
    TRELLIS_CHECK(send == mine || !overlaps(send, count * 2, recv, total * 2),
                  "16-bit all-gather: the input overlaps the output away from its own block");
    launch_all_gather(*w, send, recv, count, MPI_UINT16_T);
    return w;
  }

  // The all-gather of count elements of `type` from each rank into recv; send is this rank's
  // block of recv (in place) or does not overlap recv.
  template <class T>
  void launch_all_gather(MpiWork& w, const T* send, T* recv, size_t count, MPI_Datatype type) {
    T* mine = recv + static_cast<size_t>(rank_) * count;
    const bool in_place = send == mine;
    if (count <= g_max_chunk) {
      MPI_Request r;
      launch(w,
             MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), type, recv,
                            static_cast<int>(count), type, comm_, &r),
             "MPI_Iallgather", r);
      return;
    }
    // A block does not fit one request: every rank broadcasts its block piece by piece.
    if (!in_place) std::memcpy(mine, send, count * sizeof(T));
    for (int root = 0; root < size_; ++root) {
      T* block = recv + static_cast<size_t>(root) * count;
      for_chunks(count, [&](size_t off, int len) {
        MPI_Request r;
        launch(w, MPI_Ibcast(block + off, len, type, root, comm_, &r), "MPI_Ibcast", r);
      });
    }
  }

  std::unique_ptr<Work> all_gatherv_async(const float* send, float* recv,
                                          const std::vector<size_t>& counts) override {
    TRELLIS_CHECK(counts.size() == static_cast<size_t>(size_), "all_gatherv: {} counts for {} ranks",
                  counts.size(), size_);
    size_t total = 0;
    for (size_t c : counts) total += c;
    auto w = start({"all_gatherv", 0, total});
    if (total == 0) return w;
    TRELLIS_CHECK(!overlaps(send, counts[size_t(rank_)] * sizeof(float), recv,
                            total * sizeof(float)),
                  "all_gatherv: the input overlaps the output");
    if (total > g_max_chunk) {
      // The blocks do not fit one request: every rank broadcasts its block piece by piece.
      size_t at = 0;
      for (int root = 0; root < size_; ++root) {
        float* block = recv + at;
        if (root == rank_) std::memcpy(block, send, counts[size_t(root)] * sizeof(float));
        for_chunks(counts[size_t(root)], [&](size_t off, int len) {
          MPI_Request r;
          launch(*w, MPI_Ibcast(block + off, len, MPI_FLOAT, root, comm_, &r), "MPI_Ibcast", r);
        });
        at += counts[size_t(root)];
      }
      return w;
    }
    // The counts and displacements must live until the request completes: the work owns them.
    auto arrays = std::make_shared<std::vector<int>>(2 * counts.size());
    int displ = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      (*arrays)[r] = static_cast<int>(counts[r]);
      (*arrays)[counts.size() + r] = displ;
      displ += static_cast<int>(counts[r]);
    }
    w->on_complete = [arrays] {};
    MPI_Request r;
    launch(*w,
           MPI_Iallgatherv(send, static_cast<int>(counts[size_t(rank_)]), MPI_FLOAT, recv,
                           arrays->data(), arrays->data() + counts.size(), MPI_FLOAT, comm_, &r),
           "MPI_Iallgatherv", r);
    return w;
  }

  std::unique_ptr<Work> broadcast_async(float* buf, size_t n, int root) override {
    TRELLIS_CHECK(root >= 0 && root < size_, "broadcast root {} on communicator {} of size {}",
                  root, name_, size_);
    OpInfo info{"broadcast", 0, n};
    info.peer = root;
    auto w = start(info);
    for_chunks(n, [&](size_t off, int len) {
      MPI_Request r;
      launch(*w, MPI_Ibcast(buf + off, len, MPI_FLOAT, root, comm_, &r), "MPI_Ibcast", r);
    });
    return w;
  }

  std::unique_ptr<Work> send_async(const float* buf, size_t n, int dst, int tag) override {
    TRELLIS_CHECK(dst >= 0 && dst < size_ && dst != rank_,
                  "send to rank {} from rank {} on communicator {} of size {}", dst, rank_, name_,
                  size_);
    TRELLIS_CHECK(tag >= 0 && tag <= 32767, "send tag {} outside [0, 32767]", tag);
    OpInfo info{"send", 0, n};
    info.peer = dst;
    info.tag = tag;
    auto w = start(info);
    // Pieces of one message arrive in order: MPI does not overtake between the same pair and tag.
    for_chunks(n, [&](size_t off, int len) {
      MPI_Request r;
      launch(*w, MPI_Isend(buf + off, len, MPI_FLOAT, dst, tag, comm_, &r), "MPI_Isend", r);
    });
    return w;
  }

  std::unique_ptr<Work> recv_async(float* buf, size_t n, int src, int tag) override {
    TRELLIS_CHECK(src >= 0 && src < size_ && src != rank_,
                  "recv from rank {} on rank {} of communicator {} of size {}", src, rank_, name_,
                  size_);
    TRELLIS_CHECK(tag >= 0 && tag <= 32767, "recv tag {} outside [0, 32767]", tag);
    OpInfo info{"recv", 0, n};
    info.peer = src;
    info.tag = tag;
    auto w = start(info);
    for_chunks(n, [&](size_t off, int len) {
      MPI_Request r;
      launch(*w, MPI_Irecv(buf + off, len, MPI_FLOAT, src, tag, comm_, &r), "MPI_Irecv", r);
    });
    return w;
  }

  void all_reduce_sum(double* buf, size_t n) override {
    reduce_doubles(buf, n, MPI_SUM, "all_reduce_sum");
  }
  void all_reduce_max(double* buf, size_t n) override {
    reduce_doubles(buf, n, MPI_MAX, "all_reduce_max");
  }

  void barrier() override { bounded_barrier("barrier"); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    TRELLIS_CHECK(color >= 0, "split color {} must be >= 0", color);
    // MPI_Comm_split blocks without a timeout; a bounded barrier first catches a missing rank.
    bounded_barrier("split");
    MPI_Comm sub = MPI_COMM_NULL;
    OpInfo info{"split", seq_, 0, "floats"};
    check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", &info);
    auto c = std::make_unique<MpiCommunicator>(sub);
    c->set_timeout(timeout_s_);
    c->set_name(name_);
    return c;
  }

  [[noreturn]] void abort(const std::string& msg, int code) override {
    std::fflush(stdout);
    std::fprintf(stderr, "trellis: error: rank %d: %s\n", world_rank_, msg.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort should not return; make sure we do not either.
  }

 private:
  std::unique_ptr<MpiWork> start(OpInfo info) {
    info.seq = ++seq_;
    const bool p2p = std::strcmp(info.op, "send") == 0 || std::strcmp(info.op, "recv") == 0;
    if (g_check_collectives && !p2p && size_ > 1) check_same_collective(info);
    return std::make_unique<MpiWork>(*this, info);
  }

  // TRELLIS_CHECK_COLLECTIVES: every member is about to issue the same collective (operation,
  // element type, count, root), or the job ends naming the first member that differs.
  void check_same_collective(const OpInfo& info) {
    struct Signature {
      char op[24], unit[24];
      uint64_t n;
      int64_t root;
    };
    static_assert(sizeof(Signature) == 64);
    Signature mine{};
    std::snprintf(mine.op, sizeof mine.op, "%s", info.op);
    std::snprintf(mine.unit, sizeof mine.unit, "%s", info.unit);
    mine.n = info.n;
    mine.root = info.peer;
    std::vector<Signature> all(static_cast<size_t>(size_));
    MpiWork w(*this, OpInfo{"collective check", info.seq, 1, "signatures"});
    MPI_Request r;
    launch(w,
           MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_,
                          &r),
           "MPI_Iallgather", r);
    w.wait();
    const auto text = [](const Signature& g) {
      const std::string t = fmt::format("{} of {} {}", std::string(g.op, strnlen(g.op, 24)), g.n,
                                        std::string(g.unit, strnlen(g.unit, 24)));
      return g.root >= 0 ? t + fmt::format(" from root {}", g.root) : t;
    };
    for (int q = 0; q < size_; ++q)
      if (std::memcmp(&all[size_t(q)], &mine, sizeof mine) != 0)
        abort(fmt::format("collectives differ on communicator {} at its operation #{}: world rank "
                          "{} issues {}, world rank {} {}",
                          name_, info.seq, world_rank_, text(mine), members_[size_t(q)],
                          text(all[size_t(q)])),
              1);
  }
  // r by reference: it is read after the MPI call in the argument list has filled it in.
  void launch(MpiWork& w, int rc, const char* call, const MPI_Request& r) {
    check(rc, call, &w.info());
    w.reqs.push_back(r);
    w.mark_in_flight();
  }
  // OpenMPI's non-blocking reduce-scatter reduces the whole buffer to rank 0 and scatters it
  // (3x a ring's traffic at 2 ranks: a third of all-reduce's bandwidth between TCP nodes). A
  // ring instead: in round k each rank passes its running sum of block (rank - k - 1) to the
  // next rank and adds its own share to what the previous one passed; after p - 1 rounds it
  // holds the sum of its own block. Rounds advance inside test(), like libnbc's schedules.
  template <class T>
  void ring_reduce_scatter(MpiWork& w, const T* send, T* out, size_t count, MPI_Datatype type,
                           void (*add)(T*, const T*, size_t)) {
    const int p = size_, next = (rank_ + 1) % p, prev = (rank_ + p - 1) % p;
    // Each reduce-scatter gets its own tag above the pipeline's [0, 32767]: all ranks issue
    // them in the same order, so concurrent ones never match each other's rounds.
    const int tag = 32768 + static_cast<int>(ring_seq_++ % static_cast<uint64_t>(ring_tags_));
    const int me = rank_;
    const auto block = [send, count, me, p](int k) {
      return send + static_cast<size_t>((me - k + 2 * p) % p) * count;
    };
    // Round k receives into `out` when p - 2 - k is even (the last round always), else into a
    // scratch block, and sends what the round before received: at 2 ranks no scratch at all.
    T* scratch = nullptr;
    if (const size_t n = reduce_scatter_scratch_floats(p, count); n > 0) {
      w.staging_in.resize((n * sizeof(T) + sizeof(float) - 1) / sizeof(float));
      scratch = reinterpret_cast<T*>(w.staging_in.data());
    }
    const auto target = [out, scratch, p](int k) { return (p - 2 - k) % 2 == 0 ? out : scratch; };
    const int n = static_cast<int>(count);
    const auto round = [this, &w, n, next, prev, tag, type](const T* what, T* into) {
      MPI_Request r;
      launch(w, MPI_Irecv(into, n, type, prev, tag, comm_, &r), "MPI_Irecv", r);
      launch(w, MPI_Isend(what, n, type, next, tag, comm_, &r), "MPI_Isend", r);
    };
    round(block(1), target(0));
    w.next_round = [count, block, round, target, add, p, k = 0]() mutable {
      T* sum = target(k);
      add(sum, block(k + 2), count);
      if (++k == p - 1) return false;
      round(sum, target(k));
      return true;
    };
  }

  void reduce_doubles(double* buf, size_t n, MPI_Op op, const char* what) {
    auto w = start({what, 0, n, "doubles"});
    for_chunks(n, [&](size_t off, int len) {
      MPI_Request r;
      launch(*w, MPI_Iallreduce(MPI_IN_PLACE, buf + off, len, MPI_DOUBLE, op, comm_, &r),
             "MPI_Iallreduce", r);
    });
    w->wait();
  }
  void bounded_barrier(const char* what) {
    auto w = start({what, 0, 0});
    MPI_Request r;
    launch(*w, MPI_Ibarrier(comm_, &r), "MPI_Ibarrier", r);
    w->wait();
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  std::vector<int> peers_;    // world ranks of the other members
  std::vector<int> members_;  // world rank of each member
  uint64_t seq_ = 0;        // operations issued on this communicator, for messages
  uint64_t ring_seq_ = 0;   // ring reduce-scatters issued (the same on every rank)
  int ring_tags_ = 0;       // tags above 32767 they cycle through (0: MPI has too few)

  friend class MpiWork;
};

bool MpiWork::test() {
  if (done_) return true;
  for (;;) {
    int flag = 0;
    const int rc =
        MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE);
    comm_.check(rc, "MPI_Testall", &info_);
    if (!flag) return false;
    reqs.clear();
    if (!next_round || !next_round()) break;
  }
  mark_done();
  if (on_complete) on_complete();
  return true;
}

void MpiWork::wait() {
  if (done_) return;
  const auto t0 = Clock::now();
  g_progress.enter_wait();
  struct Leave {
    ~Leave() { g_progress.leave_wait(); }
  } leave;
  for (;;) {
    if (test()) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    if (elapsed > comm_.timeout())
      comm_.abort(fmt::format("timed out after {:g}s in {} on communicator {}, waiting for {}",
                              comm_.timeout(), describe(info_), comm_.name(), comm_.peers()),
                  1);
    // Spin for the first millisecond (latency), then yield the core between polls: ranks are
    // often oversubscribed, and a spinning rank would starve the peer it is waiting for. Sleep
    // only in long waits (pipeline bubbles, a slow peer): a sleeping rank stalls the rounds of a
    // non-blocking collective, which advance only inside MPI_Test.
    if (elapsed < 1e-3) continue;
    if (elapsed < 1.0) {
      sched_yield();
    } else {
      timespec ts{0, 200'000};
      nanosleep(&ts, nullptr);
    }
  }
}

MpiWork::~MpiWork() {
  // MPI may still write into the caller's buffers (or read staging): finish unless unwinding,
  // where the job is about to end anyway and waiting could only delay the error message.
  if (!done_ && !reqs.empty() && std::uncaught_exceptions() == 0 && !mpi_finalized()) wait();
  if (in_flight_) g_progress.remove();
}

}  // namespace

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

// Settings measured on the reference machine (bench/RESULTS.md), applied before MPI_Init.
static void tune_mpi_before_init() {
  // glibc serves every allocation >= 32 MiB with a fresh mmap and unmaps it on free, so
  // OpenMPI's message-sized temporaries paid page faults on every large collective (10-20x
  // slower all-reduces). Keep large blocks in the heap instead.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  // Every wait must be bounded, so trellis uses non-blocking collectives; OpenMPI's default
  // choice for MPI_Iallreduce ran at 0.3-0.6x of the blocking MPI_Allreduce, its ring algorithm
  // at 0.9-1.0x. A user's own setting (environment or mpirun --mca) wins: overwrite = 0.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
}

std::unique_ptr<Communicator> make_mpi_world_communicator(int* argc, char*** argv) {
  if (const char* v = std::getenv("TRELLIS_MPI_MAX_CHUNK")) {
    const long long k = std::atoll(v);
    if (k > 0 && k < INT_MAX) g_max_chunk = static_cast<size_t>(k);
  }
  g_ring_allowed = std::getenv("TRELLIS_MPI_NO_RING") == nullptr;
  if (const char* v = std::getenv("TRELLIS_CHECK_COLLECTIVES")) g_check_collectives = *v == '1';
  // The progress thread's poll interval. At 1 Gbit/s, 200 and 1000 us hid the same share of an
  // all-reduce (bench/RESULTS.md, "Communication that progresses during compute"); 500 wakes the
  // thread 2.5x less often than 200 while a pipeline send waits for its receiver.
  // TRELLIS_MPI_PROGRESS_US=0 turns it off (MPI then runs MPI_THREAD_FUNNELED, as before).
  long poll_us = 500;
  if (const char* v = std::getenv("TRELLIS_MPI_PROGRESS_US")) poll_us = std::atol(v);
  poll_us = std::clamp(poll_us, 0L, 100'000L);
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    tune_mpi_before_init();
    // The main thread makes every call but the progress thread's; OpenMP threads make none.
    const int wanted = poll_us > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    if (MPI_Init_thread(argc, argv, wanted, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "trellis: error: MPI_Init_thread failed\n");
      std::exit(1);
    }
    g_initialized_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  // An MPI without MPI_THREAD_MULTIPLE runs as before: operations move when tested.
  if (provided == MPI_THREAD_MULTIPLE) g_progress.start(poll_us);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // A private duplicate keeps trellis traffic apart from any other MPI user in the process.
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    std::fprintf(stderr, "trellis: error: rank %d: MPI_Comm_dup failed: %s\n", r,
                 mpi_error_string(rc).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  auto c = std::make_unique<MpiCommunicator>(world);
  c->set_name("world");
  return c;
}

void finalize_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized && !mpi_finalized()) g_progress.stop();
  if (g_initialized_here && initialized && !mpi_finalized()) MPI_Finalize();
}

}  // namespace detail
}  // namespace trellis
