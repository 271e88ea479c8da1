// ZeRO-1: whole buffers on every rank, one shard of the optimizer's state and update each.
#include <algorithm>

#include "trellis/core/clock.h"
#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ShardedOptimizerSync::ShardedOptimizerSync(Communicator& dp, const ParamLayout& layout)
    : DataParallelSync(dp, layout), shard_(shard_range(n_, dp_size_, dp_rank_)) {
  params_.commit(0, params_.size());
  grads_.commit(0, grads_.size());
  owned_ = {{shard_.begin, shard_.end}};
  staging_.assign(shard_.shard, 0.0f);
}

ZeroFootprint ShardedOptimizerSync::footprint(const ParamLayout& layout, int dp, int dp_rank) {
  ZeroFootprint f;
  const ShardRange s = shard_range(layout.size(), dp, dp_rank);
  f.params = f.grads = page_bytes(s.padded);
  f.owned = int64_t(s.end - s.begin);
  f.shards = (1 + ring_scratch_blocks(dp)) * int64_t(s.shard * sizeof(float));
  return f;
}

void ShardedOptimizerSync::begin_step() { std::fill_n(grads_.data(), grads_.size(), 0.0f); }

double ShardedOptimizerSync::reduce_gradients() {
  if (dp_size_ == 1) return 0.0;
  const auto t0 = Clock::now();
  dp_.reduce_scatter_async(grads_.data(), staging_.data(), shard_.shard)->wait();
  std::copy_n(staging_.data(), shard_.end - shard_.begin, grads_.data() + shard_.begin);
  return seconds_since(t0);
}

double ShardedOptimizerSync::gather_parameters() {
  if (dp_size_ == 1) return 0.0;
  const auto t0 = Clock::now();
  std::copy_n(params_.data() + shard_.begin, shard_.end - shard_.begin, staging_.data());
  dp_.all_gather_async(staging_.data(), params_.data(), shard_.shard)->wait();
  return seconds_since(t0);
}

int64_t ShardedOptimizerSync::resident_bytes() const {
  return DataParallelSync::resident_bytes() + int64_t(staging_.size() * sizeof(float));
}

}  // namespace trellis
