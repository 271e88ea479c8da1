#include "trellis/plan/calibrate.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <iterator>
#include <utility>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/core/memory.h"
#include "trellis/core/tensor.h"
#include "trellis/kernels/backend.h"
#include "trellis/kernels/ops.h"
#include "trellis/kernels/peak.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/model_chunk.h"
#include "trellis/tensor_parallel/operators.h"
#include "trellis/plan/cost_model.h"
#include "trellis/plan/machine.h"

namespace trellis {

namespace {

using Clock = std::chrono::steady_clock;

// The middle value (the upper middle of an even count).
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// time_per_call for a collective: every rank must run it the same number of times, so the
// count comes from the slowest rank's first call. The calls run in up to five batches, each
// started together after a barrier, and the median batch counts (its slowest rank's time): run
// back to back, large messages over TCP queued behind the previous call's tail and measured a
// third slower than the same collective between a training step's computations.
template <class F>
double time_collective(Communicator& world, F&& f, double seconds) {
  f();
  auto start = Clock::now();
  f();
  double first = std::chrono::duration<double>(Clock::now() - start).count();
  world.all_reduce_max(&first, 1);
  const int calls = std::max(3, int(std::min(seconds / std::max(first, 1e-9), 1e6)));
  const int batches = std::min(calls, 5), per_batch = calls / batches;
  std::vector<double> t(size_t(batches), 0.0);
  for (double& b : t) {
    world.barrier();
    start = Clock::now();
    for (int i = 0; i < per_batch; ++i) f();
    b = std::chrono::duration<double>(Clock::now() - start).count() / per_batch;
  }
  world.all_reduce_max(t.data(), t.size());
  return median(t);
}

// Seconds of a forward GEMM (X[m,k] W[k,n]) or, with `backward`, of its input- and
// weight-gradient GEMMs as Linear runs them: dX = dY W^T, dW += X^T dY.
double gemm_seconds(bool bf16, bool backward, int64_t m, int64_t n, int64_t k, double seconds) {
  std::vector<float> x(size_t(m * k), 0.5f), w(size_t(k * n), 0.25f), y(size_t(m * n), 0.f),
      dx(x.size()), dw(w.size());
  const auto gemm = bf16 ? ops::gemm_bf16 : ops::gemm;
  return time_per_call(
      [&] {
        if (!backward) {
          gemm(false, false, m, n, k, 1.f, x.data(), k, w.data(), n, 0.f, y.data(), n);
          return;
        }
        gemm(false, true, m, k, n, 1.f, y.data(), n, w.data(), n, 0.f, dx.data(), k);
        gemm(true, false, k, n, m, 1.f, x.data(), k, y.data(), n, 1.f, dw.data(), n);
      },
      seconds);
}

// GEMM shapes (M rows, N columns, K inner) of the sizes a Transformer block's projections take
// for small models and micro-batches, and the n^3 cube of --gemm-size.
std::vector<std::array<int64_t, 3>> gemm_shapes(int64_t cube) {
  return {{256, 384, 384},   {256, 1536, 384},  {256, 384, 1536}, {512, 768, 768},
          {1024, 1152, 384}, {2048, 384, 1536}, {2048, 64, 64},   {4096, 768, 3072},
          {cube, cube, cube}};
}

// trellis's causal attention kernels (forward and backward): seconds of B = 2 sequences of
// T = 256, C = 384 (6 heads of 64).
constexpr int64_t kAttB = 2, kAttT = 256, kAttC = 384, kAttH = 6;
double attention_seconds(double seconds) {
  const int64_t B = kAttB, T = kAttT, C = kAttC, H = kAttH;
  std::vector<float> qkv(size_t(B * T * 3 * C), 0.01f), out(size_t(B * T * C)),
      lse(size_t(B * H * T)), dqkv(qkv.size()), dout(out.size(), 0.02f);
  return time_per_call(
      [&] {
        ops::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, H);
        ops::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T,
                                C, H);
      },
      seconds);
}

// The block whose memory-bound ops are timed: baby's (GPT-2, width 384, MLP 1536) on 8
// sequences of 256 tokens.
ModelConfig memory_bound_block() { return model_preset("baby"); }
constexpr int64_t kBlockB = 8, kBlockT = 256;

// Blocks of the timed chunk: the chunk's own copies at its edges (its input and gradient in and
// out) weigh a quarter as much per block.
constexpr int kBlockLayers = 4;

}  // namespace

const Backend& memory_bound_kernels() {
  static const Backend k = [] {
    Backend b = backend(Device::CPU);
    b.gemm = [](auto...) {};
    b.gemm_operands = [](auto...) {};
    b.attention_forward = [](auto...) {};
    b.attention_backward = [](auto...) {};
    b.attention_forward_bf16 = [](auto...) {};
    b.attention_backward_bf16 = [](auto...) {};
    b.attention_cached = [](auto...) {};
    return b;
  }();
  return k;
}

namespace {

// Seconds of a GPT-2 block's memory-bound ops, forward and backward: the model's own blocks (a
// pipeline chunk of kBlockLayers of them, no embedding nor head) run with the GEMMs and attention
// taken out of the kernel table, so whatever else a block calls is timed, as ModelChunk calls it.
double memory_bound_seconds(double seconds) {
  const ModelConfig cfg = memory_bound_block();
  StageSpec chunk{{}, false, false};
  for (int l = 0; l < kBlockLayers; ++l) chunk.layers.push_back(l);
  const ParamLayout layout(cfg, 1, 0, &chunk);
  std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
  init_params(layout, 1, params.data());
  TensorParallel single(nullptr, false);
  // The model takes its kernels at construction; the built-in table goes back at once.
  const Backend* built_in = set_backend(Device::CPU, &memory_bound_kernels());
  ModelChunk model(layout, params.data(), grads.data(), single, &chunk);
  set_backend(Device::CPU, built_in);
  Context ctx;
  model.prepare(ctx, kBlockB, kBlockT);
  std::fill_n(ctx.input.f32(), ctx.input.numel(), 0.5f);
  std::fill_n(ctx.doutput.f32(), ctx.doutput.numel(), 0.01f);
  return time_per_call(
             [&] {
               model.forward(ctx, 1.0f);
               model.backward(ctx, true);
             },
             seconds) /
         kBlockLayers;
}

// One round of the compute measurements: each GEMM shape per precision, attention, the
// memory-bound ops (seconds per call).
struct ComputeTimes {
  std::vector<double> gemm32, gemm16, gemm32_backward, gemm16_backward;
  double attention = 0, memory_bound = 0;
};

ComputeTimes time_compute(Communicator& world, int64_t cube, double seconds) {
  ComputeTimes t;
  for (bool bf16 : {false, true})
    for (bool backward : {false, true})
      for (const auto& [m, n, k] : gemm_shapes(cube)) {
        world.barrier();
        std::vector<double>& times = bf16 ? (backward ? t.gemm16_backward : t.gemm16)
                                          : (backward ? t.gemm32_backward : t.gemm32);
        times.push_back(gemm_seconds(bf16, backward, m, n, k, seconds / 4));
      }
  world.barrier();
  t.attention = attention_seconds(seconds);
  world.barrier();
  t.memory_bound = memory_bound_seconds(seconds);
  world.barrier();
  return t;
}

// The fit of one precision's GEMMs, and their table for the file.
GemmFit fit_gemm_times(const std::vector<double>& seconds, int64_t cube, nlohmann::json& table) {
  std::vector<std::array<double, 4>> rows;
  const auto shapes = gemm_shapes(cube);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [m, n, k] = shapes[i];
    rows.push_back({2.0 * double(m * n * k), double(m * k + k * n + m * n), 1.0, seconds[i]});
    table.push_back({{"m", m}, {"n", n}, {"k", k}, {"seconds", seconds[i]}});
  }
  return fit_gemm(rows);
}

// Bytes/s of writing again pages a PageBuffer gave back and committed again, beyond writing
// resident ones: what ZeRO-2/3 pay for each released unit (release, commit, then the unit's
// writes). `huge`: PageBuffer's 2 MiB pages (a whole range released); otherwise 4 KiB pages,
// what the edges of a released range that do not fill a huge page become.
double page_refill_bandwidth(bool huge, double seconds) {
  const size_t bytes = size_t(64) << 20, floats = bytes / sizeof(float);
  PageBuffer buf(floats);
  char* p = reinterpret_cast<char*>(buf.data());
  if (!huge) madvise(p, bytes, MADV_NOHUGEPAGE);
  buf.commit(0, floats);
  std::memset(p, 1, bytes);
  const double resident = time_per_call([&] { std::memset(p, 1, bytes); }, seconds);
  const double refill = time_per_call(
      [&] {
        buf.release(0, floats);
        buf.commit(0, floats);
        std::memset(p, 1, bytes);
      },
      seconds);
  return double(bytes) / std::max(refill - resident, 1e-9);
}

// This rank's node as a split colour: its host name and first non-loopback IPv4 address (network
// namespaces on one host share the name, not the address).
int node_color() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string key = host;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next)
      if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && !(a->ifa_flags & IFF_LOOPBACK)) {
        char ip[INET_ADDRSTRLEN] = {0};
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, ip, sizeof ip);
        key += std::string("/") + ip;
        break;
      }
    freeifaddrs(list);
  }
  return int(std::hash<std::string>{}(key)&0x3fffffff);
}

// A link's fits over the ranks of `comm` (collective over it; all of its ranks time together).
nlohmann::json measure_link(Communicator& comm, double seconds) {
  const int n_ranks = comm.size();
  // Each collective timed on buffers of 1 KiB, 256 KiB, 4 MiB and 64 MiB: all-reduce 2(n-1) ring
  // steps, reduce-scatter and all-gather n-1, each moving 1/n of the buffer; send/recv (each rank
  // to the next while receiving from the previous) one step of the whole buffer. The file keeps
  // each size's time per step, and the ring fit t = steps * latency + volume * bytes / bandwidth
  // from the smallest and largest.
  const size_t sizes[] = {256, size_t(64) << 10, size_t(1) << 20, size_t(16) << 20};
  const size_t big_n = sizes[std::size(sizes) - 1];
  std::vector<float> a(big_n, 1.f), b(big_n, 0.f);
  const int next = (comm.rank() + 1) % n_ranks, prev = (comm.rank() + n_ranks - 1) % n_ranks;
  struct Kind {
    const char* name;
    double steps, share;  // ring steps, and the buffer's share each step moves
    std::function<void(size_t)> run;
  };
  const double n = n_ranks;
  const Kind kinds[] = {
      {"all_reduce", 2 * (n - 1), 1 / n, [&](size_t k) { comm.all_reduce(a.data(), k); }},
      {"reduce_scatter", n - 1, 1 / n,
       [&](size_t k) { comm.reduce_scatter_async(a.data(), b.data(), k / n_ranks)->wait(); }},
      {"all_gather", n - 1, 1 / n,
       [&](size_t k) { comm.all_gather_async(a.data(), b.data(), k / n_ranks)->wait(); }},
      {"send_recv", 1, 1, [&](size_t k) {
         auto r = comm.recv_async(b.data(), k, prev, 7);
         comm.send_async(a.data(), k, next, 7)->wait();
         r->wait();
       }}};
  nlohmann::json collectives = nlohmann::json::object();
  for (const Kind& kind : kinds) {
    nlohmann::json per_step = nlohmann::json::array();
    std::string note = fmt::format("measured over {} ranks:", n_ranks);
    for (size_t k : sizes) {
      const double t = time_collective(
          comm, [&] { kind.run(k); }, seconds);
      const double bytes = double(k * sizeof(float));
      per_step.push_back({{"bytes", kind.share * bytes}, {"seconds", t / kind.steps}});
      note += fmt::format(" {} KiB in {:.4g} ms;", k * sizeof(float) >> 10, t * 1e3);
    }
    note.pop_back();
    const double latency = per_step.front()["seconds"].get<double>();
    const double bandwidth = per_step.back()["bytes"].get<double>() /
                             std::max(per_step.back()["seconds"].get<double>() - latency, 1e-12);
    collectives[kind.name] = {
        {"latency", latency}, {"bandwidth", bandwidth}, {"per_step", per_step}, {"note", note}};
  }
  const nlohmann::json& ar = collectives["all_reduce"];
  nlohmann::json link = {
      {"bandwidth", ar["bandwidth"]},
      {"bandwidth_note", "measured: the all-reduce's (see collectives)"},
      {"latency", ar["latency"]},
      {"latency_note", "measured: the all-reduce's, per ring step"},
      {"efficiency", 1.0},
      {"collectives", collectives},
      {"collectives_note",
       "per_step: a ring step's time by its message size, from buffers of 1 KiB to 64 MiB "
       "(the planner interpolates it); latency and bandwidth: the ring fit of the smallest "
       "and largest"}};
  return link;
}

nlohmann::json gemm_json(const GemmFit& f, const nlohmann::json& table, const GemmFit& backward,
                         const nlohmann::json& backward_table) {
  const auto fit = [](const GemmFit& g, const nlohmann::json& t) {
    return nlohmann::json{
        {"rate", g.rate}, {"element_s", g.element_s}, {"call_s", g.call_s}, {"table", t}};
  };
  nlohmann::json j = fit(f, table);
  j["backward"] = fit(backward, backward_table);
  return j;
}

}  // namespace

double time_per_call(const std::function<void()>& f, double seconds, int windows,
                     const std::function<double()>& now) {
  TRELLIS_CHECK(windows >= 1, "time_per_call: {} windows", windows);
  const auto clock = now ? now : [] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  };
  f();
  double fastest = INFINITY;
  for (int w = 0; w < windows; ++w) {
    int calls = 0;
    const double start = clock();
    double elapsed = 0;
    do {
      f();
      ++calls;
      elapsed = clock() - start;
    } while (elapsed < seconds / windows);
    fastest = std::min(fastest, elapsed / calls);
  }
  return fastest;
}

double fastest_of(const std::vector<double>& samples) {
  TRELLIS_CHECK(!samples.empty(), "fastest_of: no samples");
  return *std::min_element(samples.begin(), samples.end());
}

// Gaussian elimination on the normal equations of each subset of the terms that keeps the FLOP
// term; the best fit without a negative coefficient wins.
GemmFit fit_gemm(const std::vector<std::array<double, 4>>& rows) {  // {F, E, 1, t}
  GemmFit best;
  double best_residual = INFINITY;
  for (int mask = 1; mask < 8; ++mask) {
    if (!(mask & 1)) continue;  // the FLOP term is always there
    std::vector<int> cols;
    for (int j = 0; j < 3; ++j)
      if (mask & (1 << j)) cols.push_back(j);
    const size_t k = cols.size();
    double A[3][4] = {};
    for (const auto& r : rows)
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = 0; j < k; ++j)
          A[i][j] += r[size_t(cols[i])] * r[size_t(cols[j])] / (r[3] * r[3]);
        A[i][3] += r[size_t(cols[i])] / r[3];
      }
    for (size_t i = 0; i < k; ++i)  // elimination with partial pivoting
      for (size_t r = i + 1; r < k; ++r) {
        const double f = A[r][i] / A[i][i];
        for (size_t j = i; j <= 3; ++j) A[r][j] -= f * A[i][j];
      }
    double x[3] = {};
    bool ok = true;
    for (size_t i = k; i-- > 0;) {
      double v = A[i][3];
      for (size_t j = i + 1; j < k; ++j) v -= A[i][j] * x[j];
      x[i] = v / A[i][i];
      ok = ok && std::isfinite(x[i]) && x[i] >= 0 && (i > 0 || x[i] > 0);
    }
    if (!ok) continue;
    double coef[3] = {};
    for (size_t i = 0; i < k; ++i) coef[cols[i]] = x[i];
    double residual = 0;
    for (const auto& r : rows) {
      const double e = (r[0] * coef[0] + r[1] * coef[1] + r[2] * coef[2]) / r[3] - 1;
      residual += e * e;
    }
    if (residual < best_residual) {
      best_residual = residual;
      best = {1 / coef[0], coef[1], coef[2]};
    }
  }
  TRELLIS_CHECK(best.rate > 0, "calibrate: no GEMM fit");
  return best;
}

namespace {

// Each compute measurement's fastest round.
ComputeTimes fastest_compute(Communicator& world, int gemm_size, double seconds, int rounds) {
  // Every rank measures at once, as training would run them. The rounds interleave the
  // measurements, and each kernel keeps its fastest round (as each round keeps its fastest
  // window): another job on a shared machine only ever slows a kernel down, so the fastest
  // sample is the kernel's own speed, the one number that comes back the same from one
  // calibration to the next. A median moved with whatever else ran during the calibration.
  world.barrier();
  std::vector<ComputeTimes> runs;
  for (int r = 0; r < rounds; ++r) runs.push_back(time_compute(world, gemm_size, seconds));
  const auto over_rounds = [&](auto get) {
    std::vector<double> v;
    for (const ComputeTimes& t : runs) v.push_back(get(t));
    return fastest_of(v);
  };
  ComputeTimes fastest;
  for (auto table : {&ComputeTimes::gemm32, &ComputeTimes::gemm16, &ComputeTimes::gemm32_backward,
                     &ComputeTimes::gemm16_backward})
    for (size_t i = 0; i < (runs.front().*table).size(); ++i)
      (fastest.*table).push_back(over_rounds([&](const ComputeTimes& t) { return (t.*table)[i]; }));
  fastest.attention = over_rounds([](const ComputeTimes& t) { return t.attention; });
  fastest.memory_bound = over_rounds([](const ComputeTimes& t) { return t.memory_bound; });
  return fastest;
}

// The compute times as the machine file's rates: the GEMM fits (with their tables), the largest
// GEMM's FLOP/s, attention's FLOP/s and the memory-bound ops' bytes per second.
struct ComputeRates {
  GemmFit fit32, fit16, fit32b, fit16b;
  nlohmann::json table32 = nlohmann::json::array(), table16 = nlohmann::json::array(),
                 table32b = nlohmann::json::array(), table16b = nlohmann::json::array();
  double fp32 = 0, bf16 = 0, attention = 0, memory_bound = 0;
};

ComputeRates compute_rates(const ComputeTimes& fastest, int gemm_size) {
  ComputeRates c;
  c.fit32 = fit_gemm_times(fastest.gemm32, gemm_size, c.table32);
  c.fit16 = fit_gemm_times(fastest.gemm16, gemm_size, c.table16);
  c.fit32b = fit_gemm_times(fastest.gemm32_backward, gemm_size, c.table32b);
  c.fit16b = fit_gemm_times(fastest.gemm16_backward, gemm_size, c.table16b);
  const double g = double(gemm_size);
  c.fp32 = 2 * g * g * g / fastest.gemm32.back();
  c.bf16 = 2 * g * g * g / fastest.gemm16.back();
  // FLOPs of a non-causal attention (4 B T^2 C forward, twice that backward), the count the cost
  // model uses.
  c.attention = 12.0 * double(kAttB * kAttT * kAttT * kAttC) / fastest.attention;
  // The rate that makes the cost model's byte count of the timed block take the time measured.
  c.memory_bound =
      block_memory_bound_bytes(memory_bound_block(), false, kBlockB, kBlockT, 1, false) /
      fastest.memory_bound;
  return c;
}

// The host's memory and peak: page refills, the per-core peaks times the threads, and a copy's
// bandwidth.
struct HostRates {
  double refill = 0, huge_refill = 0, threads = 0, peak32 = 0, peak16 = 0, bandwidth = 0;
};

HostRates measure_host(Communicator& world, double seconds) {
  HostRates h;
  h.refill = page_refill_bandwidth(false, seconds);
  h.huge_refill = page_refill_bandwidth(true, seconds);
  world.barrier();
  // MFU divides by the hardware's peak: the FMA (fp32) and dot-product (bf16) probes of a core,
  // times the threads.
  h.threads = double(omp_get_max_threads());
  h.peak32 = measure_peak_gflops_per_core(DType::F32) * 1e9 * h.threads;
  h.peak16 = measure_peak_gflops_per_core(DType::BF16) * 1e9 * h.threads;
  // Memory bandwidth: a 256 MiB copy reads and writes every byte.
  const size_t floats = size_t(64) << 20;
  std::vector<float> src(floats, 1.f), dst(floats, 0.f);
  const double copy_s =
      time_per_call([&] { std::memcpy(dst.data(), src.data(), floats * sizeof(float)); }, seconds);
  h.bandwidth = 2.0 * double(floats * sizeof(float)) / copy_s;
  return h;
}

struct Links {
  nlohmann::json intra, inter;
  int per_node = 1;
};

// Links: among the ranks of each node, then among the nodes (the ranks with the same place
// in theirs), each measured with all groups at once, as training runs them.
Links measure_links(Communicator& world, double seconds, double memory_bandwidth) {
  auto node = world.split(node_color(), world.rank());
  auto across = world.split(node->rank(), world.rank());
  const nlohmann::json assumed = {
      {"bandwidth", memory_bandwidth / 2},
      {"bandwidth_note",
       "assumed: one rank per node measures no link; half the memory bandwidth (a copy through "
       "shared memory)"},
      {"latency", 5e-6},
      {"latency_note", "assumed: one rank per node measures no link"},
      {"efficiency", 1.0}};
  Links l;
  l.intra = node->size() > 1 ? measure_link(*node, seconds) : assumed;
  l.inter = across->size() > 1 ? measure_link(*across, seconds) : l.intra;
  if (across->size() == 1)
    l.inter["note"] = "one node: the same as intra_node (run across hosts to measure it)";
  l.per_node = node->size();
  return l;
}

// The machine file's "device": one rank's share of the host and what it measured.
nlohmann::json device_json(const ComputeRates& c, const HostRates& h, int per_node) {
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  // The GEMMs' share of the peak; a probe that lost its core for a moment must not give an
  // efficiency above 1.
  const double efficiency = std::min(1.0, c.fp32 / h.peak32);
  return {{"memory_bytes", int64_t(phys / per_node)},
          {"memory_note", "measured: physical memory of the host divided by its ranks"},
          {"memory_bandwidth", h.bandwidth},
          {"memory_bandwidth_note", "measured: a 256 MiB memcpy on one rank while all copy"},
          {"peak_flops", {{"fp32", h.peak32}, {"bf16", h.peak16}}},
          {"peak_flops_note",
           fmt::format("measured: the per-core FMA / bf16 dot-product peak probe times {} threads; "
                       "the GEMMs reached {:.3g} (fp32) and {:.3g} (bf16) FLOP/s",
                       h.threads, c.fp32, c.bf16)},
          {"gemm_efficiency", efficiency},
          {"gemm_efficiency_note",
           "measured fp32 GEMM rate / fp32 peak; used only where device.gemm has no fit"},
          {"gemm",
           {{"fp32", gemm_json(c.fit32, c.table32, c.fit32b, c.table32b)},
            {"bf16", gemm_json(c.fit16, c.table16, c.fit16b, c.table16b)}}},
          {"gemm_note",
           "measured: the GEMMs of `table` (row-major, M x K times K x N) fitted as "
           "2MNK / rate + element_s (MK + KN + MN) + call_s (least squares of relative errors); "
           "backward: the same shapes' input- and weight-gradient GEMMs together, fitted alike"},
          {"attention_flops", c.attention},
          {"attention_flops_note",
           "measured: trellis's causal attention forward + backward (2 x 256 tokens, 6 heads of "
           "64) as FLOP/s of 12 B T^2 C"},
          {"elementwise_bandwidth", c.memory_bound},
          {"elementwise_bandwidth_note",
           "measured: a GPT-2 block's memory-bound ops forward + backward (8 x 256 tokens, width "
           "384, MLP 1536) as the planner's bytes for them (6x the kept activations, without "
           "attention's saved logsumexp) per second"},
          {"page_refill_bandwidth", h.refill},
          {"huge_page_refill_bandwidth", h.huge_refill},
          {"page_refill_bandwidth_note",
           "measured: writing 64 MiB of released 4 KiB pages (huge_: 2 MiB pages), beyond "
           "writing resident ones"}};
}

}  // namespace

nlohmann::json calibrate_machine(Communicator& world, int gemm_size, double seconds, int rounds) {
  TRELLIS_REQUIRE(gemm_size >= 16 && gemm_size <= 16384, "--gemm-size must be in [16, 16384]");
  TRELLIS_REQUIRE(seconds > 0 && seconds <= 60, "--seconds must be in (0, 60]");
  TRELLIS_REQUIRE(rounds >= 1 && rounds <= 20, "--rounds must be in [1, 20]");
  const ComputeRates compute =
      compute_rates(fastest_compute(world, gemm_size, seconds, rounds), gemm_size);
  const HostRates host_rates = measure_host(world, seconds);
  const Links links = measure_links(world, seconds, host_rates.bandwidth);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"name", fmt::format("{} ({} ranks, {} per node, measured by trellis calibrate)", host,
                               world.size(), links.per_node)},
          {"sources",
           {{"measured", fmt::format("trellis calibrate on {} at {}: {}x{} GEMMs, a 256 MiB copy, "
                                     "collectives of 1 KiB to 64 MiB; compute: the fastest of {} "
                                     "rounds",
                                     host, date, gemm_size, gemm_size, rounds)}}},
          {"devices_per_node", links.per_node},
          {"device", device_json(compute, host_rates, links.per_node)},
          {"intra_node", links.intra},
          {"inter_node", links.inter}};
}

}  // namespace trellis
