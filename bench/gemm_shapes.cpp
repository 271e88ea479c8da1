// GFLOP/s of ops::gemm on the GEMM shapes of a GPT-2 training step (row-major, as
// model/modules.cpp and model/transformer.cpp call them), against a plain dnnl_sgemm call
// (oneDNN's own threading) and against ops::gemm_bf16 (the --precision bf16 GEMM, conversions of
// the fp32 operands included), interleaved rep by rep so load from other processes hits all alike.
//   gemm_shapes <BT> <C> <Vp> [reps=5]
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "trellis/kernels/ops.h"

int main(int argc, char** argv) {
  const int64_t BT = argc > 1 ? std::atoll(argv[1]) : 256, C = argc > 2 ? std::atoll(argv[2]) : 768,
                Vp = argc > 3 ? std::atoll(argv[3]) : 50304;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  struct S {
    const char* name;
    bool ta, tb;
    int64_t M, N, K;
  };
  const S shapes[] = {
      {"qkv fwd", false, false, BT, 3 * C, C},   {"fc fwd", false, false, BT, 4 * C, C},
      {"proj4 fwd", false, false, BT, C, 4 * C}, {"fc dinp", false, true, BT, C, 4 * C},
      {"fc dW", true, false, C, 4 * C, BT},      {"proj4 dinp", false, true, BT, 4 * C, C},
      {"proj4 dW", true, false, 4 * C, C, BT},   {"logits fwd", false, true, BT, Vp, C},
      {"logits dinp", false, false, BT, C, Vp},  {"logits dW", true, false, Vp, C, BT},
  };
  std::vector<float> A(size_t(std::max({BT * Vp, Vp * C, 4 * C * C, BT * 4 * C})), 0.01f),
      B(A.size(), 0.02f), Cm(A.size());
  for (int threads : {2}) {
    omp_set_num_threads(threads);
    for (const S& s : shapes) {
      const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
      std::vector<double> t, tb, th;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        trellis::ops::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f,
                           Cm.data(), s.N);
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        t0 = std::chrono::steady_clock::now();
        dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(),
                   ldb, 1.0f, Cm.data(), s.N);
        tb.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        t0 = std::chrono::steady_clock::now();
        trellis::ops::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb,
                                1.0f, Cm.data(), s.N);
        th.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(t.begin(), t.end());
      std::sort(tb.begin(), tb.end());
      std::sort(th.begin(), th.end());
      const double a = t[0], b = tb[0], h = th[0];  // minimum: the least disturbed run
      const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
      std::printf(
          "%d thr %-12s %6lld x %6lld x %6lld  ops::gemm %7.2f ms %6.1f GFLOP/s | dnnl_sgemm %7.2f "
          "ms | x%.2f | gemm_bf16 %7.2f ms %6.1f GFLOP/s x%.2f\n",
          threads, s.name, (long long)s.M, (long long)s.N, (long long)s.K, a * 1e3, flop / a / 1e9,
          b * 1e3, b / a, h * 1e3, flop / h / 1e9, a / h);
    }
  }
}
