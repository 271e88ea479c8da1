// ZeRO-1: whole buffers on every rank, one shard of the optimizer's state and update each.
#include <algorithm>

#include "trellis/core/clock.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ShardedOptimizerSync::ShardedOptimizerSync(Communicator& dp, const ParamLayout& layout, bool mixed,
                                           GradReduceDtype grad_dtype, bool bf16_grads)
    : DataParallelSync(dp, layout, grad_dtype), shard_(shard_range(n_, dp_size_, dp_rank_)) {
  params_.commit(0, params_.size());  // mixed: until adopt_params (initialisation writes it all)
  owned_ = {{shard_.begin, shard_.end}};
  staging_.assign(shard_.shard, 0.0f);
  if (mixed) {
    // One region: the padded buffer, a shard per rank (the padding's masters stay zero).
    make_working(layout, {{0, shard_.shard, 0}});
    masters_.assign(shard_.shard, 0.0f);
  }
  if (!bf16_grads) {
    grads_.commit(0, grads_.size());
    return;
  }
  // The fp32 pages stay uncommitted outside the windows the hooks open.
  bits_ = std::make_unique<Bf16GradientBits>(layout, shard_.padded);
}

ZeroFootprint ShardedOptimizerSync::footprint(const ParamLayout& layout, int dp, int dp_rank,
                                              bool mixed, bool bf16_grads) {
  ZeroFootprint f;
  const ShardRange s = shard_range(layout.size(), dp, dp_rank);
  f.params = f.grads = page_bytes(s.padded);
  if (bf16_grads) Bf16GradientBits::footprint(f, layout, s.padded);
  f.owned = int64_t(s.end - s.begin);
  // The reduce-scatter's output (fp32, for the optimizer) and the ring's scratch block (bf16 with
  // bf16 gradients).
  f.buffers += int64_t(s.shard * sizeof(float)) +
               ring_scratch_blocks(dp) * int64_t(s.shard * (bf16_grads ? 2 : sizeof(float)));
  if (mixed) {
    // fp32 only where the kernels read it, bf16 bits of the whole buffer; the shard's masters
    // and the fp32-read elements' packed gather.
    const std::vector<FlatRange> fp32 = fp32_read_ranges(layout);
    f.params =
        WorkingWeights::fp32_page_bytes(fp32, 0, layout.size()) + page_bytes((s.padded + 1) / 2);
    f.shards = int64_t(s.shard * sizeof(float));
    f.buffers +=
        WorkingWeights::gather_floats(fp32, {0, s.shard, 0}, dp) * int64_t(sizeof(float));
  }
  return f;
}

void ShardedOptimizerSync::begin_step() {
  if (bits_)
    bits_->clear();
  else
    std::fill_n(grads_.data(), grads_.size(), 0.0f);
}

double ShardedOptimizerSync::reduce_gradients() {
  const auto t0 = Clock::now();
  if (bits_) {
    // Rank r's shard of the sum, widened into staging_ (owned_grads).
    reduce_scatter_bf16_grads(dp_, bits_->data(), staging_.data(), shard_.shard)->wait();
    return seconds_since(t0);
  }
  if (dp_size_ == 1) return 0.0;
  // Under bf16 the reduction consumes grads_; only the owned range is read after it.
  reduce_scatter_grads(dp_, grads_.data(), staging_.data(), shard_.shard, grad_dtype_)->wait();
  std::copy_n(staging_.data(), shard_.end - shard_.begin, grads_.data() + shard_.begin);
  return seconds_since(t0);
}

double ShardedOptimizerSync::gather_parameters() {
  const auto t0 = Clock::now();
  if (working_) {
    working_->finish(*working_->start(0, masters_.data(), params_), params_.data());
    return seconds_since(t0);
  }
  if (dp_size_ == 1) return 0.0;
  std::copy_n(params_.data() + shard_.begin, shard_.end - shard_.begin, staging_.data());
  dp_.all_gather_async(staging_.data(), params_.data(), shard_.shard)->wait();
  return seconds_since(t0);
}

void ShardedOptimizerSync::adopt_params(bool whole_buffer) {
  if (!working_) return;
  // Every rank holds the whole initial model: its bits are rounded here, as a gather would bring
  // them. Resumed, the masters alone were read: gathered.
  if (whole_buffer) {
    take_owned(params_.data(), masters_.data());
    working_->round_whole(0, params_.data());
  }
  working_->release_multiplied(params_);
  if (!whole_buffer)
    working_->finish(*working_->start(0, masters_.data(), params_), params_.data());
}

int64_t ShardedOptimizerSync::resident_bytes() const {
  return DataParallelSync::resident_bytes() +
         int64_t((staging_.size() + masters_.size()) * sizeof(float)) +
         (bits_ ? bits_->bytes() : 0);
}

}  // namespace trellis
