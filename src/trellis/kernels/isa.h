#pragma once
// The CPU features the kernels may use: what the CPU reports, capped by the TRELLIS_ISA
// environment variable, so one machine can run (and test) the paths of a smaller one.
#include <string>

#include "trellis/core/tensor.h"

namespace trellis {

// Ordered: each level includes the ones before it.
enum class Isa : int { Avx2, Avx512, Avx512Bf16 };

// The detected ISA capped by TRELLIS_ISA (avx2 | avx512 | avx512_bf16; unset = no cap). The first
// call also caps oneDNN's kernels at the same level. An unknown TRELLIS_ISA value is an input
// error naming the variable.
Isa cpu_isa();
const char* isa_name(Isa isa);

// The GEMM precision a run asked for ("fp32", "bf16", or "auto" = bf16 where the CPU has
// AVX512-BF16) and what it gets: bf16 on a CPU without it runs bf16 with emulated matrix products
// (slower than fp32), with `notice` saying so in one line (empty otherwise). Anything else is an
// input error.
struct Precision {
  DType compute = DType::F32;
  std::string notice;
};
Precision choose_precision(const std::string& requested);
const char* precision_name(DType compute);

}  // namespace trellis
