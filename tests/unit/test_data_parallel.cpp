// DataParallelSync: every ZeRO strategy, on 2, 3 and 4 ranks run as threads
// (tests/unit/fake_communicator.h), takes the same AdamW steps as one rank does on the gradients
// summed over the ranks, bit for bit; the sharded ones own disjoint pieces that cover the buffer
// once (so the optimizer state of each rank covers its shard only), and ZeRO-3 holds a block's
// parameters only while the block computes, or until the next pass, which starts with it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "fake_communicator.h"
#include "trellis/core/error.h"
#include "trellis/model/block_hooks.h"
#include "trellis/kernels/ops.h"
#include "trellis/model/config.h"
#include "trellis/model/model_chunk.h"
#include "trellis/model/params.h"
#include "trellis/optim/optimizer.h"
#include "trellis/parallel/zero.h"

namespace trellis {
namespace {

constexpr int kSteps = 2, kMicroBatches = 2;
constexpr uint64_t kSeed = 11;
constexpr float kLr = 1e-2f;
constexpr size_t kBucketBytes = 4096;  // several buckets for the replicated all-reduce

// Two GPT-2 blocks with a small vocabulary: units of a few thousand floats, root pieces before
// (embeddings) and after (final norm) the blocks.
ParamLayout tiny_layout() {
  ModelConfig cfg = model_preset("tiny");
  cfg.vocab_size = 16;
  cfg.validate();
  return ParamLayout(cfg);
}

// Rank r's gradient of element i in micro-batch m of step s: multiples of 1/4 below 3, so every
// sum over ranks and micro-batches is exact whatever its order.
float grad_of(int step, int rank, int micro, size_t i) {
  const size_t k = i * 7 + size_t(rank) * 13 + size_t(micro) * 5 + size_t(step) * 3;
  return float(int(k % 17) - 8) * 0.25f;
}

const ZeroUnit& block_unit(const std::vector<ZeroUnit>& units, int layer) {
  for (const ZeroUnit& u : units)
    if (u.layer == layer) return u;
  throw std::logic_error("no unit for block " + std::to_string(layer));
}

// The calls ModelChunk::forward makes around blocks (a chunk holding every block); in_block runs
// where the block computes.
void forward_pass(DataParallelSync& sync, int n_layer, const std::function<void(int)>& in_block) {
  BlockHooks* hooks = sync.hooks();
  if (hooks) hooks->before_forward(-1);
  for (int l = 0; l < n_layer; ++l) {
    if (hooks) hooks->before_forward(l);
    if (in_block) in_block(l);
    if (hooks) hooks->after_forward(l);
  }
}

// The calls ModelChunk::backward makes, each block adding its gradients where it computes: the
// head's root pieces (after the blocks) first, the blocks last to first, the embeddings' last;
// and on the last micro-batch the trainer's report of finished gradients.
void backward_pass(DataParallelSync& sync, const std::vector<ZeroUnit>& units, int n_layer,
                   bool last_micro, const std::function<float(size_t)>& grad,
                   const std::function<void(int)>& in_block = {}) {
  BlockHooks* hooks = sync.hooks();
  float* g = sync.grads();
  auto add = [&](const ZeroUnit& u) {
    for (size_t i = u.begin; i < u.end; ++i) g[i] += grad(i);
  };
  const size_t blocks_begin = block_unit(units, 0).begin;
  if (hooks) hooks->before_backward(-1);
  for (const ZeroUnit& u : units)
    if (u.layer < 0 && u.begin > blocks_begin) add(u);
  for (int l = n_layer - 1; l >= 0; --l) {
    if (hooks) hooks->before_backward(l);
    if (in_block) in_block(l);
    add(block_unit(units, l));
    if (hooks) hooks->after_backward(l);
    if (last_micro && sync.overlaps()) sync.ready_from(block_unit(units, l).begin);
  }
  for (const ZeroUnit& u : units)
    if (u.layer < 0 && u.begin < blocks_begin) add(u);
  if (hooks) hooks->after_backward(-1);
  if (last_micro && sync.overlaps()) sync.ready_from(0);
}

// The whole parameter buffer as the model sees it: the root and each block between their forward
// hooks (ZeRO-3 gathers them there).
std::vector<float> visible_params(DataParallelSync& sync, const std::vector<ZeroUnit>& units,
                                  size_t n, int n_layer) {
  std::vector<float> out(n, 0.0f);
  auto copy = [&](const ZeroUnit& u) {
    std::copy(sync.params() + u.begin, sync.params() + u.end, out.begin() + ptrdiff_t(u.begin));
  };
  forward_pass(sync, n_layer, [&](int l) {
    if (l == 0)
      for (const ZeroUnit& u : units)
        if (u.layer < 0) copy(u);
    copy(block_unit(units, l));
  });
  return out;
}

// What one rank saw.
struct RankRun {
  std::vector<FlatRange> owned;
  size_t state_bytes = 0;
  std::vector<std::vector<float>> owned_grads;  // per step, reduced (compact)
  std::vector<std::vector<float>> params;       // per step, after the update, as the model sees it
  int64_t resident_bytes = 0;                   // after the last step
};

RankRun train(Communicator& comm, ZeroStage stage, const ParamLayout& layout,
              GradReduceDtype dtype = GradReduceDtype::Fp32) {
  const int n_layer = layout.config().n_layer;
  const std::vector<ZeroUnit> units = zero_units(layout);
  std::unique_ptr<DataParallelSync> sync = make_data_parallel_sync(
      comm, stage, layout, kBucketBytes, false, dtype,
      bf16_gradient_storage(stage, dtype, comm.size(), 1, 1));
  init_params(layout, kSeed, sync->params());
  sync->adopt_params(true);
  Optimizer opt(OptimConfig{}, layout, sync->owned());
  RankRun run;
  run.owned = sync->owned();
  run.state_bytes = opt.state_bytes();
  for (int step = 1; step <= kSteps; ++step) {
    sync->begin_step();
    for (int m = 0; m < kMicroBatches; ++m) {
      forward_pass(*sync, n_layer, {});
      backward_pass(*sync, units, n_layer, m + 1 == kMicroBatches,
                    [&](size_t i) { return grad_of(step, comm.rank(), m, i); });
    }
    sync->reduce_gradients();
    const size_t owned = total_size(run.owned);
    if (const uint16_t* bits = sync->owned_grad_bits()) {  // ZeRO-0's bf16 gradients
      std::vector<float> g(owned);
      ops::from_bf16(g.data(), bits, int64_t(owned));
      run.owned_grads.push_back(g);
      opt.step_compact(sync->owned_params(), bits, kLr, step);
    } else {
      const float* g = sync->owned_grads();
      run.owned_grads.emplace_back(g, g + owned);
      opt.step_compact(sync->owned_params(), sync->owned_grads(), kLr, step);
    }
    sync->gather_parameters();
    run.params.push_back(visible_params(*sync, units, layout.size(), n_layer));
  }
  run.resident_bytes = sync->resident_bytes();
  return run;
}

// One rank, the whole buffer, the gradients of every rank and micro-batch summed.
struct Reference {
  std::vector<std::vector<float>> grads, params;  // per step
};

Reference reference(const ParamLayout& layout, int dp) {
  const size_t n = layout.size();
  std::vector<float> params(n), grads(n);
  init_params(layout, kSeed, params.data());
  Optimizer opt(OptimConfig{}, layout, 0, n);
  Reference ref;
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < n; ++i) {
      grads[i] = 0.0f;
      for (int r = 0; r < dp; ++r)
        for (int m = 0; m < kMicroBatches; ++m) grads[i] += grad_of(step, r, m, i);
    }
    opt.step_compact(params.data(), grads.data(), kLr, step);
    ref.grads.push_back(grads);
    ref.params.push_back(params);
  }
  return ref;
}

// The first index where a and b differ (as floats), or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

std::vector<float> gather_ranges(const std::vector<float>& whole,
                                 const std::vector<FlatRange>& ranges) {
  std::vector<float> out;
  for (const FlatRange& r : ranges)
    out.insert(out.end(), whole.begin() + ptrdiff_t(r.begin), whole.begin() + ptrdiff_t(r.end));
  return out;
}

// bf16: grad_reduce_dtype = bf16 (ZeRO-1 then keeps bf16 gradients). grad_of's sums are bf16
// values, so the steps are still one rank's, bit for bit.
struct Case {
  ZeroStage stage;
  int dp;
  bool bf16 = false;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "zero " << int(c.stage) << ", dp " << c.dp << (c.bf16 ? ", bf16 reduction" : "");
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return "zero" + std::to_string(int(info.param.stage)) + "_dp" + std::to_string(info.param.dp) +
         (info.param.bf16 ? "_bf16" : "");
}

class EveryStrategy : public testing::TestWithParam<Case> {};

TEST_P(EveryStrategy, TakesOneRanksStepsOnTheSummedGradients) {
  const auto [stage, dp, bf16] = GetParam();
  const ParamLayout layout = tiny_layout();
  const size_t n = layout.size();
  std::vector<RankRun> runs(static_cast<size_t>(dp));
  fake::ThreadGroup group(dp);
  const GradReduceDtype dtype = bf16 ? GradReduceDtype::Bf16 : GradReduceDtype::Fp32;
  group.run([&](Communicator& c) { runs[size_t(c.rank())] = train(c, stage, layout, dtype); });
  const Reference ref = reference(layout, dp);

  std::vector<int> owners(n, 0);
  for (int r = 0; r < dp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankRun& run = runs[size_t(r)];
    for (const FlatRange& o : run.owned)
      for (size_t i = o.begin; i < o.end; ++i) ++owners[i];
    // AdamW keeps two floats per owned element: the state of this rank's pieces only.
    EXPECT_EQ(run.state_bytes, 2 * total_size(run.owned) * sizeof(float));
    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      EXPECT_EQ(first_difference(run.owned_grads[size_t(s)],
                                 gather_ranges(ref.grads[size_t(s)], run.owned)),
                -1)
          << "reduced gradients differ from the sum over ranks";
      EXPECT_EQ(first_difference(run.params[size_t(s)], ref.params[size_t(s)]), -1)
          << "parameters differ from one rank's step";
    }
  }
  // Replicas own everything; shards own each element exactly once between them.
  const int want = stage == ZeroStage::Replicated ? dp : 1;
  for (size_t i = 0; i < n; ++i)
    if (owners[i] != want) {
      ADD_FAILURE() << "element " << i << " is owned by " << owners[i] << " ranks, not " << want;
      break;
    }
}

INSTANTIATE_TEST_SUITE_P(DataParallelSync, EveryStrategy,
                         testing::ValuesIn(std::vector<Case>{{ZeroStage::Replicated, 2},
                                                             {ZeroStage::Replicated, 4},
                                                             {ZeroStage::ShardedOptimizer, 2},
                                                             {ZeroStage::ShardedOptimizer, 3},
                                                             {ZeroStage::ShardedOptimizer, 4},
                                                             {ZeroStage::ShardedGradients, 2},
                                                             {ZeroStage::ShardedGradients, 3},
                                                             {ZeroStage::ShardedGradients, 4},
                                                             {ZeroStage::ShardedParameters, 2},
                                                             {ZeroStage::ShardedParameters, 3},
                                                             {ZeroStage::ShardedParameters, 4},
                                                             {ZeroStage::Replicated, 2, true},
                                                             {ZeroStage::Replicated, 3, true},
                                                             {ZeroStage::ShardedOptimizer, 1, true},
                                                             {ZeroStage::ShardedOptimizer, 3, true},
                                                             {ZeroStage::ShardedGradients, 3, true},
                                                             {ZeroStage::ShardedParameters, 2, true}}),
                         case_name);

// ZeRO-0 and ZeRO-1 with bf16 reduction keep 2 bytes a gradient (the windows are returned after
// each block): between steps they hold 2 bytes an element less than with fp32 gradients, but for
// the partial pages at the units' edges, which a release keeps.
TEST(DataParallelSync, ZeroZeroAndOneWithBf16ReductionKeepBf16Gradients) {
  ModelConfig cfg = model_preset("tiny");
  cfg.vocab_size = 16;
  cfg.n_embd = 256;  // units of megabytes: the edges' pages are a small part
  cfg.validate();
  const ParamLayout layout(cfg);
  const int64_t edges = 2 * int64_t(zero_units(layout).size()) * 4096;
  for (const ZeroStage stage : {ZeroStage::Replicated, ZeroStage::ShardedOptimizer}) {
    SCOPED_TRACE("zero " + std::to_string(int(stage)));
    int64_t resident[2] = {0, 0};
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      fake::ThreadGroup group(2);
      group.run([&](Communicator& c) {
        const RankRun run =
            train(c, stage, layout, bf16 ? GradReduceDtype::Bf16 : GradReduceDtype::Fp32);
        if (c.rank() == 0) resident[bf16] = run.resident_bytes;
      });
    }
    EXPECT_GE(resident[0] - resident[1], int64_t(layout.size() * 2) - edges)
        << "fp32 gradients " << resident[0] << " bytes, bf16 " << resident[1];
  }
}

// Mixed-precision state (bf16 under ZeRO-1/2/3, parallel/working_weights.h): each rank's fp32
// masters take one rank's AdamW steps bit for bit, and what the model sees after every update is
// those parameters rounded to bf16 (the working weights, every element) plus the exact fp32
// values of the tensors kernels read in fp32; the other tensors' fp32 values are gone (released:
// they read as zero).
struct MixedRun {
  std::vector<FlatRange> owned;
  std::vector<std::vector<float>> masters;    // per step, compact
  std::vector<std::vector<uint16_t>> bits;    // per step, as the model sees them
  std::vector<std::vector<float>> fp32_read;  // per step, the fp32-read ranges concatenated
  size_t fp32_left = 0;  // after adopt_params: nonzero fp32 values outside the fp32-read ranges
};

MixedRun train_mixed(Communicator& comm, ZeroStage stage, const ParamLayout& layout) {
  const int n_layer = layout.config().n_layer;
  const std::vector<ZeroUnit> units = zero_units(layout);
  const std::vector<FlatRange> fp32 = fp32_read_ranges(layout);
  MixedRun run;
  auto sync = make_data_parallel_sync(comm, stage, layout, kBucketBytes, true);
  init_params(layout, kSeed, sync->params());
  sync->adopt_params(true);
  size_t at = 0;
  for (const FlatRange& f : fp32) {
    for (; at < f.begin; ++at) run.fp32_left += sync->params()[at] != 0.0f;
    at = f.end;
  }
  for (; at < layout.size(); ++at) run.fp32_left += sync->params()[at] != 0.0f;
  Optimizer opt(OptimConfig{}, layout, sync->owned());
  run.owned = sync->owned();
  for (int step = 1; step <= kSteps; ++step) {
    sync->begin_step();
    for (int m = 0; m < kMicroBatches; ++m) {
      forward_pass(*sync, n_layer, {});
      backward_pass(*sync, units, n_layer, m + 1 == kMicroBatches,
                    [&](size_t i) { return grad_of(step, comm.rank(), m, i); });
    }
    sync->reduce_gradients();
    opt.step_compact(sync->owned_params(), sync->owned_grads(), kLr, step);
    sync->gather_parameters();
    const float* mp = sync->owned_params();
    run.masters.emplace_back(mp, mp + total_size(run.owned));
    // The root and each block between their forward hooks (ZeRO-3 gathers them there).
    std::vector<uint16_t> bits(layout.size(), 0);
    std::vector<float> f32(layout.size(), 0.0f);
    auto copy = [&](const ZeroUnit& u) {
      std::copy(sync->working_bits() + u.begin, sync->working_bits() + u.end,
                bits.begin() + ptrdiff_t(u.begin));
      std::copy(sync->params() + u.begin, sync->params() + u.end,
                f32.begin() + ptrdiff_t(u.begin));
    };
    forward_pass(*sync, n_layer, [&](int l) {
      if (l == 0)
        for (const ZeroUnit& u : units)
          if (u.layer < 0) copy(u);
      copy(block_unit(units, l));
    });
    run.bits.push_back(bits);
    run.fp32_read.push_back(gather_ranges(f32, fp32));
  }
  return run;
}

// cfg: GPT-2 with a vocabulary whose embedding spans several ranks' chunks and is gathered in
// place (WorkingWeights::kDirect), beside norms and biases gathered packed; or its tables read
// in bf16 (bf16_embeddings), so that only norms and biases are.
void check_mixed_state(ZeroStage stage, int dp, const ModelConfig& cfg) {
  const ParamLayout layout(cfg);
  ASSERT_GE(size_t(cfg.vocab_size * cfg.n_embd), 2 * WorkingWeights::kDirect);
  std::vector<MixedRun> runs(static_cast<size_t>(dp));
  fake::ThreadGroup group(dp);
  group.run([&](Communicator& c) { runs[size_t(c.rank())] = train_mixed(c, stage, layout); });
  const Reference ref = reference(layout, dp);
  const std::vector<FlatRange> fp32 = fp32_read_ranges(layout);
  ASSERT_GT(total_size(fp32), 0u);
  ASSERT_LT(total_size(fp32), layout.size() / 2) << "most parameters are multiplied weights";
  for (int r = 0; r < dp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const MixedRun& run = runs[size_t(r)];
    EXPECT_EQ(run.fp32_left, 0u) << "the multiplied weights' fp32 values released";
    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      const std::vector<float>& want = ref.params[size_t(s)];
      EXPECT_EQ(first_difference(run.masters[size_t(s)], gather_ranges(want, run.owned)), -1)
          << "masters differ from one rank's step";
      std::vector<uint16_t> rounded(want.size());
      ops::to_bf16(rounded.data(), want.data(), int64_t(want.size()));
      const auto& bits = run.bits[size_t(s)];
      const auto diff = std::mismatch(bits.begin(), bits.end(), rounded.begin());
      EXPECT_TRUE(diff.first == bits.end())
          << "working weight " << (diff.first - bits.begin()) << " is not the master rounded";
      EXPECT_EQ(first_difference(run.fp32_read[size_t(s)], gather_ranges(want, fp32)), -1)
          << "an fp32-read tensor differs from one rank's step";
    }
  }
}

class MixedPrecisionState : public testing::TestWithParam<Case> {};

ModelConfig mixed_state_model(bool bf16_embeddings) {
  ModelConfig cfg = model_preset("tiny");
  cfg.vocab_size = 512;
  cfg.bf16_embeddings = bf16_embeddings;
  cfg.validate();
  return cfg;
}

TEST_P(MixedPrecisionState, MastersInTheShardBf16WorkingWeightsFp32OnlyWhereRead) {
  const auto [stage, dp, bf16_reduction] = GetParam();
  ASSERT_FALSE(bf16_reduction) << "fp32 reductions only";
  check_mixed_state(stage, dp, mixed_state_model(false));
}

// With bf16_embeddings the token and position tables leave the fp32 ranges: their fp32 values
// are released too, and the model reads their working weights.
TEST_P(MixedPrecisionState, Bf16EmbeddingsKeepNoFp32Tables) {
  const auto [stage, dp, bf16_reduction] = GetParam();
  ASSERT_FALSE(bf16_reduction) << "fp32 reductions only";
  const ModelConfig cfg = mixed_state_model(true);
  const ParamLayout with(cfg), without(mixed_state_model(false));
  const size_t tables =
      with.find(Slot::TokEmbed, -1)->numel() + with.find(Slot::PosEmbed, -1)->numel();
  EXPECT_EQ(total_size(fp32_read_ranges(with)) + tables, total_size(fp32_read_ranges(without)));
  check_mixed_state(stage, dp, cfg);
}

INSTANTIATE_TEST_SUITE_P(DataParallelSync, MixedPrecisionState,
                         testing::ValuesIn(std::vector<Case>{{ZeroStage::ShardedOptimizer, 2},
                                                             {ZeroStage::ShardedOptimizer, 3},
                                                             {ZeroStage::ShardedGradients, 2},
                                                             {ZeroStage::ShardedGradients, 3},
                                                             {ZeroStage::ShardedParameters, 2},
                                                             {ZeroStage::ShardedParameters, 4}}),
                         case_name);

bool all_zero(const float* p, const ZeroUnit& u) {
  for (size_t i = u.begin; i < u.end; ++i)
    if (p[i] != 0.0f) return false;
  return true;
}

TEST(DataParallelSync, ZeroThreeHoldsABlockOnlyWhileItComputesOrRunsNext) {
  const ParamLayout layout = tiny_layout();
  const int n_layer = layout.config().n_layer;
  const std::vector<ZeroUnit> units = zero_units(layout);
  std::vector<float> init(layout.size());
  init_params(layout, kSeed, init.data());
  constexpr int dp = 2;
  // Per rank: blocks found gathered while they computed (forward and backward), blocks found
  // released after adopt_params, the forward, the backward and gather_parameters (which starts
  // the first block's gather); root units found released after the update and gathered when the
  // next forward opens; and the bytes held.
  struct Seen {
    int present = 0, absent = 0, root_absent = 0, root_present = 0;
    int64_t before = 0, after = 0, reduced = 0, updated = 0, root_bytes = 0;
    std::vector<int64_t> during;
  };
  const size_t page = size_t(sysconf(_SC_PAGESIZE)) / sizeof(float);
  // A root unit's whole pages (a release keeps the pages it shares with a block).
  std::vector<ZeroUnit> root_pages;
  for (const ZeroUnit& u : units) {
    const size_t lo = (u.begin + page - 1) / page * page, hi = u.end / page * page;
    if (u.layer < 0 && lo < hi) root_pages.push_back({lo, hi, -1});
  }
  ASSERT_FALSE(root_pages.empty());
  std::vector<Seen> seen(dp);
  fake::ThreadGroup group(dp);
  group.run([&](Communicator& c) {
    Seen& s = seen[size_t(c.rank())];
    auto sync = make_data_parallel_sync(c, ZeroStage::ShardedParameters, layout, kBucketBytes);
    init_params(layout, kSeed, sync->params());
    sync->adopt_params(true);
    const float* p = sync->params();
    auto count_absent = [&] {
      for (int l = 0; l < n_layer; ++l)
        if (all_zero(p, block_unit(units, l))) ++s.absent;
    };
    auto count_present = [&](int l) {
      const ZeroUnit& u = block_unit(units, l);
      if (std::equal(p + u.begin, p + u.end, init.begin() + ptrdiff_t(u.begin))) ++s.present;
    };
    count_absent();
    s.before = sync->resident_bytes();
    sync->begin_step();
    forward_pass(*sync, n_layer, [&](int l) {
      count_present(l);
      s.during.push_back(sync->resident_bytes());
    });
    s.after = sync->resident_bytes();
    count_absent();
    backward_pass(
        *sync, units, n_layer, true, [](size_t) { return 0.0f; }, count_present);
    count_absent();
    sync->reduce_gradients();
    s.reduced = sync->resident_bytes();
    sync->gather_parameters();
    count_absent();
    s.updated = sync->resident_bytes();
    for (const ZeroUnit& u : root_pages) {
      s.root_absent += all_zero(p, u);
      s.root_bytes += int64_t((u.end - u.begin) * sizeof(float));
    }
    forward_pass(*sync, n_layer, [&](int l) {
      if (l == 0)
        for (const ZeroUnit& u : root_pages)
          s.root_present += std::equal(p + u.begin, p + u.end, init.begin() + ptrdiff_t(u.begin));
    });
  });
  for (int r = 0; r < dp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Seen& s = seen[size_t(r)];
    EXPECT_EQ(s.present, 2 * n_layer) << "blocks gathered for forward and backward";
    // The forward's last block stays for the backward, which starts with it; the backward's
    // last (the first block) for the next forward, whose gather after the update reuses its pages.
    EXPECT_EQ(s.absent, n_layer + 3 * (n_layer - 1))
        << "blocks released after adopt, and all but the next pass's first after the forward, the "
           "backward and the gather after the update";
    // Each block's pages come while it runs (with the next one's, prefetched) and go after; the
    // last block's stay, and nothing else.
    ASSERT_EQ(s.during.size(), size_t(n_layer));
    for (int64_t bytes : s.during) EXPECT_GT(bytes, s.before);
    EXPECT_GT(s.after, s.before);
    EXPECT_EQ(s.after, s.during.back());
    // Between steps a rank holds no root (the paper's 16/d bytes per parameter).
    EXPECT_EQ(s.root_absent, int(root_pages.size())) << "root released at the update";
    EXPECT_EQ(s.root_present, int(root_pages.size())) << "root gathered when a forward opens";
    EXPECT_LE(s.updated, s.reduced - s.root_bytes) << "the root's pages returned";
  }
}

TEST(DataParallelSync, HooksOnlyWhereBlocksAreSharded) {
  const ParamLayout layout = tiny_layout();
  fake::ThreadGroup group(2);
  group.run([&](Communicator& c) {
    for (int z = 0; z <= 3; ++z) {
      auto sync = make_data_parallel_sync(c, zero_stage(z), layout, kBucketBytes);
      if ((sync->hooks() != nullptr) != (z >= 2))
        throw std::logic_error("zero " + std::to_string(z) + ": hooks are wrong");
      if (sync->sharded() != (z >= 1))
        throw std::logic_error("zero " + std::to_string(z) + ": sharded() is wrong");
    }
  });
}

TEST(DataParallelSync, StageParsedFromTheConfigsInteger) {
  EXPECT_EQ(zero_stage(0), ZeroStage::Replicated);
  EXPECT_EQ(zero_stage(1), ZeroStage::ShardedOptimizer);
  EXPECT_EQ(zero_stage(2), ZeroStage::ShardedGradients);
  EXPECT_EQ(zero_stage(3), ZeroStage::ShardedParameters);
  for (int bad : {-1, 4}) {
    try {
      zero_stage(bad);
      ADD_FAILURE() << "zero " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find("zero must be 0, 1, 2 or 3 (got " + std::to_string(bad) + ")"),
          std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace trellis
