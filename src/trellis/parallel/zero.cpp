#include "trellis/parallel/zero.h"

#include <unistd.h>

#include <algorithm>

#include "trellis/core/bf16.h"
#include "trellis/core/error.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ZeroStage zero_stage(int zero) {
  TRELLIS_REQUIRE(zero >= 0 && zero <= 3, "zero must be 0, 1, 2 or 3 (got {})", zero);
  static constexpr ZeroStage kStages[] = {ZeroStage::Replicated, ZeroStage::ShardedOptimizer,
                                          ZeroStage::ShardedGradients,
                                          ZeroStage::ShardedParameters};
  return kStages[zero];
}

std::unique_ptr<DataParallelSync> make_data_parallel_sync(Communicator& dp, ZeroStage stage,
                                                          const ParamLayout& layout,
                                                          size_t bucket_bytes, bool mixed,
                                                          GradReduceDtype grad_dtype,
                                                          bool bf16_grads) {
  TRELLIS_CHECK(!mixed || mixed_precision_state(stage, true), "mixed-precision state under ZeRO-0");
  TRELLIS_CHECK(!bf16_grads || bf16_gradient_storage(stage, grad_dtype, dp.size(), 1, 1),
                "bf16 gradient storage without bf16 reduction at ZeRO-0/1");
  switch (stage) {
    case ZeroStage::Replicated:
      return std::make_unique<ReplicatedSync>(dp, layout, bucket_bytes, grad_dtype, bf16_grads);
    case ZeroStage::ShardedOptimizer:
      return std::make_unique<ShardedOptimizerSync>(dp, layout, mixed, grad_dtype, bf16_grads);
    case ZeroStage::ShardedGradients:
      return std::make_unique<ShardedGradientsSync>(dp, layout, mixed, grad_dtype);
    case ZeroStage::ShardedParameters:
      return std::make_unique<ShardedParametersSync>(dp, layout, mixed, grad_dtype);
  }
  TRELLIS_CHECK(false, "unknown ZeRO stage {}", int(stage));
  return nullptr;
}

std::vector<int> unit_index_by_layer(const std::vector<ZeroUnit>& units) {
  std::vector<int> out;
  for (size_t i = 0; i < units.size(); ++i) {
    const int layer = units[i].layer;
    if (layer < 0) continue;
    if (out.size() <= size_t(layer)) out.resize(size_t(layer) + 1, -1);
    out[size_t(layer)] = int(i);
  }
  return out;
}

int64_t gradient_window_bytes(const ParamLayout& layout, int blocks) {
  const int64_t page = int64_t(sysconf(_SC_PAGESIZE));
  int64_t root = 0, block = 0;
  for (const ZeroUnit& u : zero_units(layout)) {
    const int64_t bytes = int64_t((u.end - u.begin) * sizeof(float)) + 2 * page;
    if (u.layer < 0)
      root += bytes;
    else
      block = std::max(block, bytes);
  }
  return std::min(page_bytes(layout.size()), root + blocks * block);
}

bool bf16_gradient_storage(ZeroStage stage, GradReduceDtype grad_dtype, int dp, int tp, int pp) {
  if (grad_dtype != GradReduceDtype::Bf16 || dp == 1 || pp > 1) return false;
  return stage == ZeroStage::ShardedOptimizer || (stage == ZeroStage::Replicated && tp == 1);
}

Bf16GradientBits::Bf16GradientBits(const ParamLayout& layout, size_t padded)
    : bits_(padded, 0), units_(zero_units(layout)), unit_of_layer_(unit_index_by_layer(units_)),
      open_(units_.size(), 0) {}

void Bf16GradientBits::footprint(ZeroFootprint& f, const ParamLayout& layout, size_t padded) {
  f.grads = int64_t(padded * sizeof(uint16_t));
  f.buffers += gradient_window_bytes(layout, 1);
}

void Bf16GradientBits::open(int layer, PageBuffer& grads) {
  auto commit = [&](size_t i) {
    grads.commit(units_[i].begin, units_[i].end);
    open_[i] = 1;
  };
  if (layer >= 0) {
    commit(size_t(unit_of_layer_.at(size_t(layer))));
    return;
  }
  for (size_t i = 0; i < units_.size(); ++i)
    if (units_[i].layer < 0) commit(i);
}

void Bf16GradientBits::fold(int layer, PageBuffer& grads) {
  // A block folds the root pieces above it too: backward has finished them (the head's), and
  // ZeRO-0's buckets above the block's start are reduced once it ends.
  const size_t from = layer >= 0 ? units_[size_t(unit_of_layer_.at(size_t(layer)))].begin : 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const ZeroUnit& u = units_[i];
    if (!open_[i] || u.begin < from || (u.layer >= 0 && u.layer != layer)) continue;
    const float* g = grads.data();
    uint16_t* bits = bits_.data();
    for (size_t k = u.begin; k < u.end; ++k) bits[k] = round_bf16(widen_bf16(bits[k]) + g[k]);
    grads.release(u.begin, u.end);
    open_[i] = 0;
  }
}

ZeroFootprint zero_footprint(const ParamLayout& layout, int dp, int dp_rank, ZeroStage stage,
                             bool mixed, bool bf16_grads) {
  switch (stage) {
    case ZeroStage::Replicated:
      return ReplicatedSync::footprint(layout, dp, bf16_grads);
    case ZeroStage::ShardedOptimizer:
      return ShardedOptimizerSync::footprint(layout, dp, dp_rank, mixed, bf16_grads);
    case ZeroStage::ShardedGradients:
      return ShardedGradientsSync::footprint(layout, dp, dp_rank, mixed);
    case ZeroStage::ShardedParameters:
      return ShardedParametersSync::footprint(layout, dp, dp_rank, mixed);
  }
  TRELLIS_CHECK(false, "unknown ZeRO stage {}", int(stage));
  return {};
}

DataParallelSync::DataParallelSync(Communicator& dp, const ParamLayout& layout,
                                   GradReduceDtype grad_dtype)
    : dp_(dp), dp_size_(dp.size()), dp_rank_(dp.rank()), n_(layout.size()),
      grad_dtype_(grad_dtype) {
  // ZeRO-1's reduce-scatter reads a buffer padded to a multiple of dp.
  const size_t padded = shard_range(n_, dp_size_, 0).padded;
  params_ = PageBuffer(padded);
  grads_ = PageBuffer(padded);
}

DataParallelSync::~DataParallelSync() = default;

bool mixed_precision_state(ZeroStage stage, bool bf16) {
  return bf16 && stage != ZeroStage::Replicated;
}

void DataParallelSync::make_working(const ParamLayout& layout,
                                    std::vector<WorkingWeights::Region> regions) {
  working_ = std::make_unique<WorkingWeights>(dp_, params_.size(), fp32_read_ranges(layout),
                                              std::move(regions));
}

void DataParallelSync::take_owned(const float* whole, float* compact) const {
  for (const FlatRange& r : owned_) {
    std::copy(whole + r.begin, whole + r.end, compact);
    compact += r.size();
  }
}

int64_t DataParallelSync::resident_bytes() const {
  return params_.committed_bytes() + grads_.committed_bytes() +
         (working_ ? working_->resident_bytes() : 0);
}

ShardRange shard_range(size_t n, int dp, int rank) {
  TRELLIS_CHECK(dp >= 1 && rank >= 0 && rank < dp, "shard of rank {} among {} ranks", rank, dp);
  ShardRange s;
  const size_t d = static_cast<size_t>(dp);
  s.padded = (n + d - 1) / d * d;
  s.shard = s.padded / d;
  s.begin = std::min(n, static_cast<size_t>(rank) * s.shard);
  s.end = std::min(n, s.begin + s.shard);
  return s;
}

std::vector<ZeroUnit> zero_units(const ParamLayout& layout) {
  std::vector<const ParamSpec*> specs;
  for (const auto& s : layout.specs()) specs.push_back(&s);
  std::sort(specs.begin(), specs.end(),
            [](const ParamSpec* a, const ParamSpec* b) { return a->offset < b->offset; });
  // Maximal runs of one block's tensors (alignment gaps included); the rest is root.
  std::vector<ZeroUnit> units;
  std::vector<char> seen;
  for (size_t i = 0; i < specs.size();) {
    const int layer = specs[i]->layer;
    size_t j = i;
    while (j < specs.size() && specs[j]->layer == layer) ++j;
    if (layer >= 0) {
      if (seen.size() <= size_t(layer)) seen.resize(size_t(layer) + 1, 0);
      TRELLIS_CHECK(!seen[size_t(layer)], "block {}'s tensors are not contiguous", layer);
      seen[size_t(layer)] = 1;
    }
    units.push_back({i == 0 ? 0 : specs[i]->offset,
                     j < specs.size() ? specs[j]->offset : layout.size(), layer});
    i = j;
  }
  return units;
}

int64_t page_bytes(size_t floats) {
  const int64_t page = int64_t(sysconf(_SC_PAGESIZE));
  return (int64_t(floats * sizeof(float)) + page - 1) / page * page;
}

// Scratch a reduce-scatter holds per float of its output while it runs (the backend says).
int64_t ring_scratch_blocks(int dp) { return int64_t(reduce_scatter_scratch_floats(dp, 1)); }

}  // namespace trellis
