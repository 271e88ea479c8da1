// ZeRO-1: whole buffers on every rank, one shard of the optimizer's state and update each.
#include <algorithm>

#include "trellis/core/clock.h"
#include "trellis/kernels/cpu/bf16_lanes.h"
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
  grad_bits_.assign(shard_.padded, 0);
  units_ = zero_units(layout);
  unit_of_layer_ = unit_index_by_layer(units_);
}

ZeroFootprint ShardedOptimizerSync::footprint(const ParamLayout& layout, int dp, int dp_rank,
                                              bool mixed, bool bf16_grads) {
  ZeroFootprint f;
  const ShardRange s = shard_range(layout.size(), dp, dp_rank);
  f.params = f.grads = page_bytes(s.padded);
  // bf16 gradients: 2 bytes each, and the fp32 windows of the root and the block in backward.
  if (bf16_grads)
    f.grads = int64_t(s.padded * sizeof(uint16_t)) + gradient_window_bytes(layout, 1);
  f.owned = int64_t(s.end - s.begin);
  // The reduce-scatter's output (fp32, for the optimizer) and the ring's scratch block (bf16 with
  // bf16 gradients).
  f.shards = int64_t(s.shard * sizeof(float)) +
             ring_scratch_blocks(dp) * int64_t(s.shard * (bf16_grads ? 2 : sizeof(float)));
  if (mixed) {
    // fp32 only where the kernels read it, bf16 bits of the whole buffer; the shard's masters
    // and the fp32-read elements' packed gather.
    const std::vector<FlatRange> fp32 = fp32_read_ranges(layout);
    f.params =
        WorkingWeights::fp32_page_bytes(fp32, 0, layout.size()) + page_bytes((s.padded + 1) / 2);
    f.shards += int64_t(s.shard * sizeof(float)) +
                WorkingWeights::gather_floats(fp32, {0, s.shard, 0}, dp) * int64_t(sizeof(float));
  }
  return f;
}

void ShardedOptimizerSync::begin_step() {
  if (grad_bits_.empty())
    std::fill_n(grads_.data(), grads_.size(), 0.0f);
  else
    std::fill(grad_bits_.begin(), grad_bits_.end(), uint16_t{0});
}

// layer -1 opens (closes) the micro-batch's backward: the root units; else the block's unit.
void ShardedOptimizerSync::before_backward(int layer) {
  if (layer >= 0) {
    const ZeroUnit& u = units_[size_t(unit_of_layer_.at(size_t(layer)))];
    grads_.commit(u.begin, u.end);
    return;
  }
  for (const ZeroUnit& u : units_)
    if (u.layer < 0) grads_.commit(u.begin, u.end);
}

void ShardedOptimizerSync::after_backward(int layer) {
  if (layer >= 0) {
    fold(units_[size_t(unit_of_layer_.at(size_t(layer)))]);
    return;
  }
  for (const ZeroUnit& u : units_)
    if (u.layer < 0) fold(u);
}

void ShardedOptimizerSync::fold(const ZeroUnit& u) {
  const float* g = grads_.data();
  uint16_t* bits = grad_bits_.data();
  for (size_t i = u.begin; i < u.end; ++i)
    bits[i] = simd::round_bf16(simd::widen_bf16(bits[i]) + g[i]);
  grads_.release(u.begin, u.end);
}

double ShardedOptimizerSync::reduce_gradients() {
  const auto t0 = Clock::now();
  if (!grad_bits_.empty()) {
    // Rank r's shard of the sum, widened into staging_ (owned_grads); one rank: a copy.
    reduce_scatter_bf16_grads(dp_, grad_bits_.data(), staging_.data(), shard_.shard)->wait();
    return dp_size_ == 1 ? 0.0 : seconds_since(t0);
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
         int64_t(grad_bits_.size() * sizeof(uint16_t));
}

}  // namespace trellis
