#pragma once
// How the GEMMs share the threads: outside an OpenMP parallel region, C is cut into one block per
// thread along its larger dimension and each block is one single-threaded library call over the
// full K. oneDNN's own partitioning of GPT-2's shapes was poor for some of them (bench/gemm_shapes:
// [256 x 768] x [768 x 3072] ran at ~40% of the speed of two half-width calls). Each element of C
// is computed by one call, and the cut depends only on the thread count, so results are
// reproducible run to run.
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace trellis::ops {

// Calls block(t, split_n, lo, hi) for each thread t < omp_get_max_threads() with its rows
// (split_n false) or columns (true) [lo, hi) of C[M, N], or block(0, true, 0, N) once when the
// product is too small to be worth splitting or the caller is already inside a parallel region.
// block must not throw.
template <class Block>
void for_each_gemm_block(int64_t M, int64_t N, int64_t K, Block block) {
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  constexpr double kMinFlopsToSplit = 4e6;
  if (nt <= 1 || 2.0 * double(M) * double(N) * double(K) < kMinFlopsToSplit) {
    block(0, true, int64_t(0), N);
    return;
  }
  const bool split_n = N >= M;
  const int64_t D = split_n ? N : M;
  constexpr int64_t kAlign = 16;  // block edges on 64-byte boundaries of C's rows
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n_threads = omp_get_num_threads();
    auto edge = [&](int i) {
      return std::min(D, (D * i / n_threads + kAlign / 2) / kAlign * kAlign);
    };
    const int64_t lo = t == 0 ? 0 : edge(t), hi = t == n_threads - 1 ? D : edge(t + 1);
    if (hi > lo) block(t, split_n, lo, hi);
  }
}

}  // namespace trellis::ops
