// model/ and core/: Tensor storage, parameter layouts of every family (names, tensor-parallel
// slices that tile the global tensor exactly once, tied copies) and the kernel backend table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/core/tensor.h"
#include "trellis/kernels/backend.h"
#include "trellis/kernels/isa.h"
#include "trellis/kernels/peak.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"

namespace trellis {
namespace {

TEST(Tensor, OwnedIsZeroedAndAlignedViewsAreNot) {
  Tensor t = Tensor::zeros({3, 5});
  ASSERT_TRUE(t.owned());
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.f32()[i], 0.0f);
  float buf[4] = {1, 2, 3, 4};
  Tensor v = Tensor::view(buf, {2, 2});
  EXPECT_FALSE(v.owned());
  EXPECT_EQ(v.f32(), buf);
}

TEST(Tensor, ReadingBf16AsF32IsAnError) {
  Tensor t = Tensor::zeros({4}, DType::BF16);
  EXPECT_EQ(t.bytes(), 8u);
  EXPECT_THROW(t.f32(), Error);
}

TEST(Tensor, FitKeepsStorageOfTheSameSize) {
  Tensor t;
  fit(t, {2, 8});
  void* first = t.data();
  fit(t, {4, 4});  // same element count: reused, reshaped
  EXPECT_EQ(t.data(), first);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{4, 4}));
  fit(t, {3, 8});
  EXPECT_EQ(t.numel(), 24);
}

// Every element of every global tensor is held by exactly one tensor-parallel rank (replicated
// tensors by all of them), whatever the family's splits and fused parts.
void expect_slices_tile(const ModelConfig& cfg, int tp) {
  const ParamLayout global(cfg);
  std::vector<int> seen(global.size(), 0);
  for (int r = 0; r < tp; ++r) {
    const ParamLayout local(cfg, tp, r);
    ASSERT_EQ(local.specs().size(), global.specs().size());
    for (const auto& s : local.specs()) {
      const ParamSpec& g = global.spec(s.name);
      for (int64_t i = 0; i < int64_t(s.numel()); ++i) {
        const int64_t gi = s.global_index(i, r);
        ASSERT_LT(gi, int64_t(g.numel())) << s.name;
        seen[g.offset + size_t(gi)] += s.split_dim < 0 ? (r == 0 ? 1 : 0) : 1;
      }
    }
  }
  for (const auto& s : global.specs())
    for (size_t i = 0; i < s.numel(); ++i) ASSERT_EQ(seen[s.offset + i], 1) << s.name << " " << i;
}

TEST(ParamLayout, TensorParallelSlicesTileEveryFamily) {
  for (const char* preset : {"tiny", "llama-tiny", "encoder-tiny", "encdec-tiny"}) {
    ModelConfig cfg = model_preset(preset);
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    if (cfg.arch == "gpt2") cfg.n_kv_head = 0;
    SCOPED_TRACE(preset);
    expect_slices_tile(cfg, 2);
  }
}

TEST(ParamLayout, LlamaNamesAndShapesFollowHuggingFace) {
  ModelConfig cfg = model_preset("llama-tiny");  // 4 heads over 2 kv heads, width 32, MLP 64
  const ParamLayout layout(cfg);
  EXPECT_EQ(layout.spec("model.layers.1.self_attn.q_proj.weight").shape,
            (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(layout.spec("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(layout.spec("model.layers.0.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{32, 64}));
  EXPECT_TRUE(layout.has("lm_head.weight"));
  EXPECT_TRUE(layout.has("model.norm.weight"));
  EXPECT_FALSE(layout.has("model.norm.bias"));
  for (const auto& s : layout.specs()) EXPECT_FALSE(s.bias) << s.name;
}

TEST(ParamLayout, StagesThatUseTheEmbeddingHoldTiedCopies) {
  const ModelConfig cfg = model_preset("encdec-tiny");  // blocks 0-1 encoder, 2-3 decoder
  StageSpec first{{0, 1}, true, false}, decoder_start{{2}, false, false}, last{{3}, false, true};
  const ParamLayout a(cfg, 1, 0, &first), b(cfg, 1, 0, &decoder_start), c(cfg, 1, 0, &last);
  EXPECT_FALSE(a.spec("model.shared.weight").tied_copy);
  EXPECT_TRUE(b.spec("model.shared.weight").tied_copy);
  EXPECT_TRUE(b.has("model.encoder.layer_norm.weight"));
  EXPECT_TRUE(b.has("model.decoder.embed_positions.weight"));
  EXPECT_TRUE(c.spec("model.shared.weight").tied_copy);
  // Parameters count once, whichever stages hold copies.
  EXPECT_EQ(a.count() + b.count() + c.count(), ParamLayout(cfg).count());
}

TEST(ParamLayout, TensorParallelMustDivideKeyValueHeads) {
  const ModelConfig cfg = model_preset("llama-tiny");  // 2 kv heads
  try {
    ParamLayout layout(cfg, 4, 0);
    FAIL() << "tp=4 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("key/value heads 2"), std::string::npos) << e.what();
  }
}

TEST(Backend, InstalledTableReplacesTheBuiltInOneUntilRemoved) {
  const Backend& cpu = backend(Device::CPU);
  Backend mine = cpu;
  EXPECT_EQ(set_backend(Device::CPU, &mine), nullptr);
  EXPECT_EQ(&backend(Device::CPU), &mine);
  EXPECT_EQ(set_backend(Device::CPU, nullptr), &mine);
  EXPECT_EQ(&backend(Device::CPU), &cpu);
  EXPECT_THROW(backend(Device::CUDA), Error);
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// The probe behind MFU: a positive, finite rate for fp32 and for bf16 on any x86-64-v3 machine
// (never a crash), and a name that says which: AVX512-BF16 dot products where the CPU has them,
// else the fp32 FMAs its emulated bf16 GEMMs run on.
TEST(PeakProbe, MeasuresWhatTheCpuHas) {
  for (DType d : {DType::F32, DType::BF16}) {
    const double peak = measure_peak_gflops_per_core(d, 0.01);
    EXPECT_GT(peak, 0.0) << precision_name(d);
    EXPECT_TRUE(std::isfinite(peak)) << precision_name(d);
  }
  __builtin_cpu_init();
  const std::string bf16 = peak_name(DType::BF16);
  if (__builtin_cpu_supports("avx512bf16") && !std::getenv("TRELLIS_ISA"))
    EXPECT_EQ(bf16, "measured bf16 dot-product peak");
  else
    EXPECT_NE(bf16.find("emulated"), std::string::npos) << bf16;
  EXPECT_EQ(std::string(peak_name(DType::F32)), "measured fp32 FMA peak");
}

}  // namespace
}  // namespace trellis
