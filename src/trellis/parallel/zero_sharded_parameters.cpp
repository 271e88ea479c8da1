// ZeRO-3 (FSDP): ZeRO-2, and a block's parameters resident only while it runs: gathered before
// its forward and again before its backward (the next block prefetched meanwhile), released
// after, except a pass's last block, which the next pass starts with (held_). The root unit
// stays gathered.
#include <unistd.h>

#include <algorithm>

#include "trellis/core/clock.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ShardedParametersSync::ShardedParametersSync(Communicator& dp, const ParamLayout& layout,
                                             bool mixed, GradReduceDtype grad_dtype)
    : ShardedGradientsSync(dp, layout, mixed, grad_dtype) {}

ZeroFootprint ShardedParametersSync::footprint(const ParamLayout& layout, int dp, int dp_rank,
                                               bool mixed) {
  ZeroFootprint f = ShardedGradientsSync::footprint(layout, dp, dp_rank, mixed);
  // Parameters: the root (a model state: it stays gathered) and two blocks (buffers), as the
  // gradients' windows, or under mixed precision each as its fp32-read tensors' pages and its
  // bf16 bits.
  if (!mixed) {
    f.params = gradient_window_bytes(layout, 0);
    f.buffers += gradient_window_bytes(layout, 2) - f.params;
    return f;
  }
  const std::vector<FlatRange> fp32 = fp32_read_ranges(layout);
  const int64_t page = int64_t(sysconf(_SC_PAGESIZE));
  int64_t root = 0, block = 0;
  for (const ZeroUnit& u : zero_units(layout)) {
    const int64_t bytes = WorkingWeights::fp32_page_bytes(fp32, u.begin, u.end) +
                          WorkingWeights::bits_bytes(u.begin, u.end, true);
    if (u.layer < 0)
      root += bytes;
    else
      block = std::max(block, bytes);
  }
  const int64_t all = std::min(WorkingWeights::fp32_page_bytes(fp32, 0, layout.size()) +
                                   int64_t(layout.size() * sizeof(uint16_t)) + 2 * page,
                               root + 2 * block);
  f.params = std::min(root, all);
  f.buffers += all - f.params;
  return f;
}

void ShardedParametersSync::release_params(int u) {
  if (working_)
    working_->release(size_t(u), params_);
  else
    params_.release(units_[size_t(u)].begin, units_[size_t(u)].end);
  gathered_[size_t(u)] = 0;
}

void ShardedParametersSync::hold_or_release(int u, bool hold) {
  if (hold)
    held_ = u;
  else
    release_params(u);
}

void ShardedParametersSync::drop_held_except(int u) {
  // A forward without a backward (evaluation) leaves its last block held, and the next forward
  // starts with the first: the held block goes before the prefetch, so two blocks stay the most.
  if (held_ >= 0 && held_ != u) release_params(held_);
  held_ = -1;
}

void ShardedParametersSync::before_forward(int layer) {
  drop_held_except(unit_of(layer));
  ensure_gathered(unit_of(layer));
  prefetch(unit_of(layer + 1));
}

// The last block's backward comes next (after the head's): its parameters stay, where releasing
// them would leave a gather that nothing overlaps.
void ShardedParametersSync::after_forward(int layer) {
  hold_or_release(unit_of(layer), unit_of(layer + 1) < 0);
}

void ShardedParametersSync::before_backward(int layer) {
  ShardedGradientsSync::before_backward(layer);
  if (layer < 0) return;
  drop_held_except(unit_of(layer));
  ensure_gathered(unit_of(layer));
  prefetch(unit_of(layer - 1));
}

// Likewise the first block, which the next micro-batch's forward starts with; after the last
// micro-batch its pages stay for the gather after the update (gather_parameters).
void ShardedParametersSync::after_backward(int layer) {
  if (layer >= 0) hold_or_release(unit_of(layer), unit_of(layer - 1) < 0);
  ShardedGradientsSync::after_backward(layer);
}

double ShardedParametersSync::gather_parameters() {
  // The root now; the first block's updated parameters start moving into the pages it kept,
  // as under ZeRO-2 (any other held block is out of date: released).
  const auto t0 = Clock::now();
  drop_held_except(unit_of(0));
  gather_root();
  prefetch(unit_of(0));
  return seconds_since(t0);
}

void ShardedParametersSync::adopt_params(bool whole_buffer) {
  if (whole_buffer) take_owned(params_.data(), owned_params_.data());
  held_ = -1;
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer >= 0) release_params(int(u));
  if (working_) {
    // The root's bits from the initial model every rank holds, as ZeRO-2 (working_weights.h).
    if (whole_buffer)
      for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].layer < 0) working_->round_whole(u, params_.data());
    working_->release_multiplied(params_);
  }
  if (!whole_buffer) gather_root();
}

}  // namespace trellis
