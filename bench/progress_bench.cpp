// How to keep MPI's non-blocking collectives moving while a rank computes (issue 27 §2): the two
// candidates on plain MPI, against no helper at all, in the same run.
//
//   none      MPI_THREAD_FUNNELED; the rank enters MPI only when it waits (trellis before).
//   commthr   (a) MPI_THREAD_SERIALIZED; a communication thread owns every MPI call: the caller
//             queues a request and waits on a flag; the thread starts it and tests it, sleeping
//             `poll_us` between tests while something is pending and on a condition otherwise.
//   progress  (b) MPI_THREAD_MULTIPLE; the caller makes its own MPI calls; a progress thread
//             calls MPI_Iprobe on a private communicator (which runs MPI's progress engine),
//             sleeping `poll_us` between calls while something is pending.
//
// Per mode, two numbers: (1) overlap: an all-reduce of --mib MiB is started, the rank computes
// for --compute-ms without any MPI call, then waits: "exposed" is the wait of the rank that
// computed longest (the others' waits include the skew between ranks), "slowdown" the compute
// time over the same compute alone; (2) latency: --small blocking all-reduces of 256 floats (the
// tensor-parallel pattern), microseconds each. Medians of --reps; other times are the slowest
// rank's. The mode is chosen per process (MPI's thread level is set once):
//
//   mpirun -np 2 progress_bench --mode none|commthr|progress [--mib 41] [--compute-ms 400]
//          [--poll-us 50] [--reps 5] [--small 2000]
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void nap(long us) {
  timespec ts{0, us * 1000};
  nanosleep(&ts, nullptr);
}

// Compute without MPI: a dependent chain of FMAs over a cache-resident array.
float g_sink = 0;
void compute(double seconds) {
  static std::vector<float> a(4096, 1.0001f);
  const double t0 = now();
  float s = 0;
  while (now() - t0 < seconds)
    for (int rep = 0; rep < 64; ++rep)
      for (float x : a) s = s * 0.999f + x;
  g_sink += s;
}

// Fixed work (not fixed time), to see how much a helper thread slows the compute down.
double compute_work(long iters) {
  static std::vector<float> a(4096, 1.0001f);
  const double t0 = now();
  float s = 0;
  for (long it = 0; it < iters; ++it)
    for (float x : a) s = s * 0.999f + x;
  g_sink += s;
  return now() - t0;
}

std::string g_mode;
long g_poll_us = 50;

// ---- (b) progress thread: the caller calls MPI itself ------------------------------------
std::atomic<int> g_pending{0};
std::atomic<bool> g_stop{false};
std::mutex g_mu;
std::condition_variable g_cv;
MPI_Comm g_probe_comm = MPI_COMM_NULL;

void progress_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(g_mu);
      g_cv.wait(lock, [] { return g_stop.load() || g_pending.load() > 0; });
    }
    if (g_stop) return;
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g_probe_comm, &flag, MPI_STATUS_IGNORE);
    nap(g_poll_us);
  }
}

// ---- (a) communication thread: owns every MPI call -----------------------------------------
struct Op {
  std::function<void(MPI_Request*)> start;
  MPI_Request req = MPI_REQUEST_NULL;
  std::atomic<bool> done{false};
};
std::deque<Op*> g_queue;
std::vector<Op*> g_active;

void comm_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(g_mu);
      g_cv.wait(lock, [] { return g_stop.load() || !g_queue.empty() || !g_active.empty(); });
      if (g_stop) return;
      while (!g_queue.empty()) {
        Op* op = g_queue.front();
        g_queue.pop_front();
        op->start(&op->req);
        g_active.push_back(op);
      }
    }
    bool progressed = false;
    for (size_t i = 0; i < g_active.size();) {
      int flag = 0;
      MPI_Test(&g_active[i]->req, &flag, MPI_STATUS_IGNORE);
      if (flag) {
        g_active[i]->done.store(true, std::memory_order_release);
        g_active.erase(g_active.begin() + long(i));
        progressed = true;
      } else {
        ++i;
      }
    }
    if (!g_active.empty() && !progressed) nap(g_poll_us);
  }
}

// One collective in flight, however the mode runs it: start() then finish().
struct Handle {
  MPI_Request req = MPI_REQUEST_NULL;
  Op op;
};

void start(Handle& h, std::function<void(MPI_Request*)> fn) {
  if (g_mode == "commthr") {
    h.op.start = std::move(fn);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_queue.push_back(&h.op);
    }
    g_cv.notify_one();
    return;
  }
  fn(&h.req);
  if (g_mode == "progress") {
    if (g_pending.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lock(g_mu);
      g_cv.notify_one();
    }
  }
}

// Waits as trellis does: spin for 1 ms, then yield between polls.
void finish(Handle& h) {
  const double t0 = now();
  if (g_mode == "commthr") {
    while (!h.op.done.load(std::memory_order_acquire))
      if (now() - t0 > 1e-3) sched_yield();
    return;
  }
  for (;;) {
    int flag = 0;
    MPI_Test(&h.req, &flag, MPI_STATUS_IGNORE);
    if (flag) break;
    if (now() - t0 > 1e-3) sched_yield();
  }
  if (g_mode == "progress") g_pending.fetch_sub(1);
}

double reduce(double t, MPI_Op op) {
  double m = 0;
  // Blocking reductions for the bench's own bookkeeping go through the same path.
  Handle h;
  start(h, [&](MPI_Request* r) { MPI_Iallreduce(&t, &m, 1, MPI_DOUBLE, op, MPI_COMM_WORLD, r); });
  finish(h);
  return m;
}
double slowest(double t) { return reduce(t, MPI_MAX); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double mib = 41, compute_ms = 400;
  int reps = 5, small = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--mode")
      g_mode = v;
    else if (a == "--mib")
      mib = std::atof(v);
    else if (a == "--compute-ms")
      compute_ms = std::atof(v);
    else if (a == "--poll-us")
      g_poll_us = std::atol(v);
    else if (a == "--reps")
      reps = std::max(1, std::atoi(v));
    else if (a == "--small")
      small = std::atoi(v);
    else {
      std::fprintf(stderr, "progress_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (g_mode != "none" && g_mode != "commthr" && g_mode != "progress") {
    std::fprintf(stderr, "progress_bench: --mode none|commthr|progress\n");
    return 2;
  }
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);  // as trellis sets it
  const int want = g_mode == "progress"  ? MPI_THREAD_MULTIPLE
                   : g_mode == "commthr" ? MPI_THREAD_SERIALIZED
                                         : MPI_THREAD_FUNNELED;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, want, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (provided < want) {
    std::fprintf(stderr, "progress_bench: asked thread level %d, MPI provided %d\n", want,
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::thread helper;
  if (g_mode == "progress") {
    MPI_Comm_dup(MPI_COMM_WORLD, &g_probe_comm);
    helper = std::thread(progress_loop);
  } else if (g_mode == "commthr") {
    helper = std::thread(comm_loop);
  }

  // Fixed-work compute alone, to compare against compute with a collective in flight.
  long iters = 1;
  while (compute_work(iters) < compute_ms * 1e-3 / 4) iters *= 2;
  iters = long(double(iters) * compute_ms * 1e-3 / compute_work(iters));
  std::vector<double> alone;
  for (int r = 0; r < 3; ++r) alone.push_back(compute_work(iters));
  const double t_alone = median(alone);

  const size_t n = size_t(mib * (1 << 20) / sizeof(float));
  std::vector<float> buf(n, 1.0f);
  std::vector<double> exposed, total, comp;
  for (int r = 0; r < reps + 1; ++r) {
    Handle b;
    start(b, [&](MPI_Request* q) {
      MPI_Barrier(MPI_COMM_WORLD);
      *q = MPI_REQUEST_NULL;
    });
    finish(b);
    const double t0 = now();
    Handle h;
    start(h, [&](MPI_Request* q) {
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, q);
    });
    const double tc = compute_work(iters);
    const double t1 = now();
    finish(h);
    const double t2 = now();
    if (r == 0) continue;  // warm-up
    // The rank that computed longest waits only for what the collective still lacks; the
    // others' waits include that skew.
    exposed.push_back(reduce(t2 - t1, MPI_MIN));
    total.push_back(slowest(t2 - t0));
    comp.push_back(slowest(tc));
  }
  // The all-reduce's own time, with nothing else running.
  std::vector<double> own;
  for (int r = 0; r < reps; ++r) {
    Handle h;
    const double t0 = now();
    start(h, [&](MPI_Request* q) {
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, q);
    });
    finish(h);
    own.push_back(slowest(now() - t0));
  }
  std::vector<float> tiny(256, 1.0f);
  const double s0 = now();
  for (int i = 0; i < small; ++i) {
    Handle h;
    start(h, [&](MPI_Request* q) {
      MPI_Iallreduce(MPI_IN_PLACE, tiny.data(), 256, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, q);
    });
    finish(h);
  }
  const double small_us = slowest(now() - s0) / std::max(1, small) * 1e6;
  if (rank == 0)
    std::printf(
        "%-9s ranks %d  all-reduce %.0f MiB: own %.0f ms, exposed %.0f ms (%.0f%% of own) "
        "after %.0f ms compute (alone %.0f ms, slowdown %.2fx); %d x 1 KiB all-reduce: "
        "%.1f us each  [poll %ld us]\n",
        g_mode.c_str(), size, mib, median(own) * 1e3, median(exposed) * 1e3,
        100 * median(exposed) / median(own), median(comp) * 1e3, t_alone * 1e3,
        median(comp) / t_alone, small, small_us, g_poll_us);
  g_stop = true;
  { std::lock_guard<std::mutex> lock(g_mu); }
  g_cv.notify_all();
  if (helper.joinable()) helper.join();
  if (g_probe_comm != MPI_COMM_NULL) MPI_Comm_free(&g_probe_comm);
  MPI_Finalize();
  return 0;
}
