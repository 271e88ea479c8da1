// Tiled attention (ops::attention_forward/backward, saving a logsumexp) against the kernel that
// keeps the T x T probabilities (ops::attention_probs_*), forward + backward of GPT-2-like causal
// (or, --causal 0, bidirectional) self-attention on a fused q|k|v buffer, for each T. The two kernels alternate within each round
// so both see the same machine load; the table gives each one's median and the median of the
// per-round ratios (probs / tiled: > 1 means the tiled kernel is faster).
//
// usage: attention_bench [--B 4] [--H 12] [--hd 64] [--T 128,256,512,1024,2048] [--rounds 7]
//                        [--key-block 0] [--query-block 0] [--causal 1] [--clock wall|cpu]
// (blocks 0: the kernel's own choice, ops::attention_tiles)
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trellis/kernels/ops.h"

using namespace trellis;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Wall time, or with --clock cpu the process's CPU time: on a machine shared with other jobs
// the CPU time of a one-thread run is far steadier than the wall time (time slices taken by the
// other jobs do not count; their cache pollution still does).
bool cpu_clock = false;
double now() {
  if (!cpu_clock)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
template <class F>
double seconds(F f) {
  const double t0 = now();
  f();
  return now() - t0;
}
}  // namespace

int main(int argc, char** argv) {
  int64_t B = 4, H = 12, hd = 64, rounds = 7, key_block = 0, query_block = 0, causal = 1;
  std::string Ts = "128,256,512,1024,2048";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--B")
      B = std::atoll(v);
    else if (k == "--H")
      H = std::atoll(v);
    else if (k == "--hd")
      hd = std::atoll(v);
    else if (k == "--T")
      Ts = v;
    else if (k == "--rounds")
      rounds = std::atoll(v);
    else if (k == "--key-block")
      key_block = std::atoll(v);
    else if (k == "--query-block")
      query_block = std::atoll(v);
    else if (k == "--causal")
      causal = std::atoll(v);
    else if (k == "--clock")
      cpu_clock = std::strcmp(v, "cpu") == 0;
    else {
      std::fprintf(stderr, "attention_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::printf(
      "%s attention forward + backward, B %lld, H %lld, hd %lld, %d threads, "
      "tiles %lld x %lld (0: the kernel's choice), %lld rounds, %s time\n\n",
      causal ? "causal" : "bidirectional", (long long)B, (long long)H, (long long)hd,
      omp_get_max_threads(), (long long)query_block,
      (long long)key_block, (long long)rounds, cpu_clock ? "CPU" : "wall");
  std::printf(
      "| T | probs kernel ms (fwd + bwd) | tiled ms (fwd + bwd) | probs / tiled "
      "(median of rounds) |\n");
  std::printf("|---:|---:|---:|---:|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const char* p = Ts.c_str(); *p;) {
    const int64_t T = std::strtoll(p, const_cast<char**>(&p), 10);
    if (*p == ',') ++p;
    const int64_t C = H * hd;
    std::vector<float> qkv(size_t(B * T * 3 * C)), dout(size_t(B * T * C));
    for (float& x : qkv) x = nd(rng);
    for (float& x : dout) x = nd(rng);
    std::vector<float> out(dout.size()), lse(size_t(B * H * T)), probs(size_t(B * H * T * T));
    std::vector<float> dqkv(qkv.size());
    ops::AttentionShape s{B, T, T, H, H, hd, causal != 0};
    s.tiles = {query_block, key_block};
    const float *q = qkv.data(), *k = q + C, *v = q + 2 * C;
    float *dq = dqkv.data(), *dk = dq + C, *dv = dq + 2 * C;
    auto tiled_fwd = [&] {
      ops::attention_forward(out.data(), lse.data(), q, 3 * C, k, v, 3 * C, s);
    };
    auto tiled_bwd = [&] {
      ops::attention_backward(dq, dk, dv, dout.data(), q, 3 * C, k, v, 3 * C, out.data(),
                              lse.data(), s);
    };
    auto probs_fwd = [&] {
      ops::attention_probs_forward(out.data(), probs.data(), q, 3 * C, k, v, 3 * C, s);
    };
    auto probs_bwd = [&] {
      ops::attention_probs_backward(dq, dk, dv, dout.data(), q, 3 * C, k, v, 3 * C, probs.data(),
                                    s);
    };
    // Warm up both (page faults, oneDNN's kernels).
    tiled_fwd(), tiled_bwd(), probs_fwd(), probs_bwd();
    std::vector<double> tf, tb, pf, pb, ratio;
    for (int64_t r = 0; r < rounds; ++r) {
      auto run_tiled = [&] {
        tf.push_back(seconds(tiled_fwd));
        tb.push_back(seconds(tiled_bwd));
      };
      auto run_probs = [&] {
        pf.push_back(seconds(probs_fwd));
        pb.push_back(seconds(probs_bwd));
      };
      if (r % 2)
        run_tiled(), run_probs();
      else
        run_probs(), run_tiled();
      ratio.push_back((pf.back() + pb.back()) / (tf.back() + tb.back()));
    }
    std::printf("| %lld | %.2f + %.2f | %.2f + %.2f | %.3f |\n", (long long)T, 1e3 * median(pf),
                1e3 * median(pb), 1e3 * median(tf), 1e3 * median(tb), median(ratio));
    std::fflush(stdout);
  }
  return 0;
}
