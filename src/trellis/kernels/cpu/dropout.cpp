#include <vector>

#include "trellis/kernels/cpu/dropout_mask.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

void dropout(float* out, const float* in, const float* residual, int64_t rows, int64_t row0,
             int64_t T, int64_t C, const Dropout& d) {
#pragma omp parallel
  {
    std::vector<float> m(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = row0 + i;
      dropout_multipliers(m.data(), 0, C, d, uint64_t(r % T), uint64_t(d.seq0 + r / T), 0);
      const float* x = in + i * C;
      float* y = out + i * C;
      for (int64_t c = 0; c < C; ++c) y[c] = x[c] * m[size_t(c)];
      // A pass of its own: the product is rounded before the add (no FMA contraction), as in
      // x + dropout(branch) of the reference.
      if (residual)
        for (int64_t c = 0, i0 = i * C; c < C; ++c) y[c] += residual[i0 + c];
    }
  }
}

}  // namespace trellis::ops
