#include "trellis/plan/calibrate.h"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>

#include <omp.h>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"
#include "trellis/core/tensor.h"
#include "trellis/kernels/peak.h"

namespace trellis {

namespace {

using Clock = std::chrono::steady_clock;

// Runs f until `seconds` have passed (at least twice, the first untimed); seconds per call.
template <class F>
double time_per_call(F&& f, double seconds) {
  f();
  int calls = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds || calls < 2);
  return elapsed / calls;
}

double gemm_rate(bool bf16, int64_t n, double seconds) {
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n), 0.f);
  const double t = time_per_call(
      [&] {
        (bf16 ? ops::gemm_bf16 : ops::gemm)(false, false, n, n, n, 1.f, a.data(), n, b.data(), n,
                                            0.f, c.data(), n);
      },
      seconds);
  return 2.0 * double(n) * double(n) * double(n) / t;
}

}  // namespace

nlohmann::json calibrate_machine(Communicator& world, int gemm_size, double seconds) {
  TRELLIS_REQUIRE(gemm_size >= 16 && gemm_size <= 16384, "--gemm-size must be in [16, 16384]");
  TRELLIS_REQUIRE(seconds > 0 && seconds <= 60, "--seconds must be in (0, 60]");
  const int ranks = world.size();
  // Every rank measures at once, as training would run them.
  world.barrier();
  const double fp32 = gemm_rate(false, gemm_size, seconds);
  world.barrier();
  const double bf16 = gemm_rate(true, gemm_size, seconds);
  world.barrier();
  // MFU divides by the hardware's peak: the FMA (fp32) and dot-product (bf16) probes of a core,
  // times the threads; the GEMMs' share of it is the efficiency.
  const double threads = double(omp_get_max_threads());
  const double peak32 = measure_peak_gflops_per_core(DType::F32) * 1e9 * threads;
  const double peak16 = measure_peak_gflops_per_core(DType::BF16) * 1e9 * threads;
  const double efficiency = fp32 / peak32;
  // Memory bandwidth: a 256 MiB copy reads and writes every byte.
  const size_t floats = size_t(64) << 20;
  std::vector<float> src(floats, 1.f), dst(floats, 0.f);
  const double copy_s =
      time_per_call([&] { std::memcpy(dst.data(), src.data(), floats * sizeof(float)); }, seconds);
  const double bandwidth = 2.0 * double(floats * sizeof(float)) / copy_s;
  nlohmann::json link;
  if (ranks > 1) {
    // Ring all-reduce: t = 2(n-1) alpha + 2(n-1)/n bytes / beta.
    std::vector<float> small(256, 1.f), big(size_t(16) << 20, 1.f);
    world.barrier();
    const double t_small =
        time_per_call([&] { world.all_reduce(small.data(), small.size()); }, seconds);
    world.barrier();
    const double t_big = time_per_call([&] { world.all_reduce(big.data(), big.size()); }, seconds);
    double times[2] = {t_small, t_big};
    world.all_reduce_max(times, 2);
    const double steps = 2.0 * (ranks - 1);
    const double alpha = times[0] / steps;
    const double bytes = double(big.size() * sizeof(float));
    const double beta = steps / ranks * bytes / std::max(times[1] - steps * alpha, 1e-9);
    link = {{"bandwidth", beta},
            {"bandwidth_note", fmt::format("measured: a {} MiB all-reduce over {} ranks took "
                                           "{:.2f} ms",
                                           bytes / (1 << 20), ranks, times[1] * 1e3)},
            {"latency", alpha},
            {"latency_note", fmt::format("measured: a 1 KiB all-reduce over {} ranks took "
                                         "{:.1f} us, per ring step",
                                         ranks, times[0] * 1e6)},
            {"efficiency", 1.0}};
  } else {
    link = {{"bandwidth", bandwidth / 2},
            {"bandwidth_note",
             "assumed: one rank measures no link; half the memory bandwidth "
             "(a copy through shared memory)"},
            {"latency", 5e-6},
            {"latency_note", "assumed: one rank measures no link"},
            {"efficiency", 1.0}};
  }
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json j = {
      {"name", fmt::format("{} ({} ranks, measured by trellis calibrate)", host, ranks)},
      {"sources",
       {{"measured", fmt::format("trellis calibrate on {} at {}: {}x{} GEMMs, a 256 MiB copy, "
                                 "all-reduces of 1 KiB and 64 MiB",
                                 host, date, gemm_size, gemm_size)}}},
      {"devices_per_node", ranks},
      {"device",
       {{"memory_bytes", int64_t(phys / ranks)},
        {"memory_note", "measured: physical memory of the host divided by its ranks"},
        {"memory_bandwidth", bandwidth},
        {"memory_bandwidth_note", "measured: a 256 MiB memcpy on one rank while all copy"},
        {"peak_flops", {{"fp32", peak32}, {"bf16", peak16}}},
        {"peak_flops_note",
         fmt::format("measured: the per-core FMA / bf16 dot-product peak probe times {} threads; "
                     "the GEMMs reached {:.3g} (fp32) and {:.3g} (bf16) FLOP/s",
                     threads, fp32, bf16)},
        {"gemm_efficiency", efficiency},
        {"gemm_efficiency_note", "measured fp32 GEMM rate / fp32 peak (bf16 assumed the same)"}}},
      {"intra_node", link},
      {"inter_node", link}};
  return j;
}

}  // namespace trellis
