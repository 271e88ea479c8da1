#include "trellis/kernels/isa.h"

#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <string>

#include "trellis/core/error.h"

namespace trellis {

namespace {
Isa detect() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    return Isa::Avx2;
  return __builtin_cpu_supports("avx512bf16") ? Isa::Avx512Bf16 : Isa::Avx512;
}

Isa capped() {
  Isa isa = detect();
  const char* env = std::getenv("TRELLIS_ISA");
  if (!env || !*env) return isa;
  const std::string v = env;
  TRELLIS_REQUIRE(v == "avx2" || v == "avx512" || v == "avx512_bf16",
                  "TRELLIS_ISA='{}' is not one of avx2, avx512, avx512_bf16", v);
  const Isa cap = v == "avx2" ? Isa::Avx2 : v == "avx512" ? Isa::Avx512 : Isa::Avx512Bf16;
  if (cap < isa) isa = cap;
  // oneDNN's own dispatch follows the cap (its fp32 GEMM would otherwise still use AVX-512).
  const dnnl_cpu_isa_t dnnl_isa = isa == Isa::Avx2     ? dnnl_cpu_isa_avx2
                                  : isa == Isa::Avx512 ? dnnl_cpu_isa_avx512_core
                                                       : dnnl_cpu_isa_avx512_core_bf16;
  dnnl_set_max_cpu_isa(dnnl_isa);  // fails only once oneDNN has dispatched; then it keeps its own
  return isa;
}
}  // namespace

Isa cpu_isa() {
  static const Isa isa = capped();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

Precision choose_precision(const std::string& requested) {
  TRELLIS_REQUIRE(requested == "fp32" || requested == "bf16" || requested == "auto",
                  "precision '{}' is not one of fp32, bf16, auto", requested);
  // Tests only: TRELLIS_TEST_EMULATED_BF16=1 lets a CPU without AVX512-BF16 run bf16 through the
  // emulated GEMM (an fp32 GEMM of the rounded operands, kernels/cpu/bf16.cpp), so that the
  // mixed-precision tests run their layouts on any machine.
  const char* emulate = std::getenv("TRELLIS_TEST_EMULATED_BF16");
  const bool has_bf16 =
      cpu_isa() >= Isa::Avx512Bf16 || (emulate && std::string(emulate) == "1");
  if (requested == "fp32" || (requested == "auto" && !has_bf16)) return {DType::F32, ""};
  if (has_bf16) return {DType::BF16, ""};
  return {DType::F32, fmt::format("precision bf16 needs AVX512-BF16, which this CPU ({}) lacks: "
                                  "running in fp32",
                                  isa_name(cpu_isa()))};
}

const char* precision_name(DType compute) { return compute == DType::BF16 ? "bf16" : "fp32"; }

}  // namespace trellis
