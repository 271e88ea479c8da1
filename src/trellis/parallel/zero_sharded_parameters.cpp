// ZeRO-3 (FSDP): ZeRO-2, and a block's parameters resident only while it runs: gathered before
// its forward and again before its backward (the next block prefetched meanwhile), released
// after, except a pass's last block, which the next pass starts with (held_). The root units are
// gathered when a forward opens and released at the update: between steps only shards remain.
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
  // Parameters: the root and two blocks, all buffers (gathered during a step, released at the
  // update), as the gradients' windows, or under mixed precision each as its fp32-read tensors'
  // pages and its bf16 bits.
  f.params = 0;
  if (!mixed) {
    f.buffers += gradient_window_bytes(layout, 2);
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
  f.buffers += std::min(WorkingWeights::fp32_page_bytes(fp32, 0, layout.size()) +
                            int64_t(layout.size() * sizeof(uint16_t)) + 2 * page,
                        root + 2 * block);
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
  if (layer < 0) {
    // The root, released at the update: after the first block's gather, which moved while the
    // step began (one gather in flight at a time).
    if (prefetch_) ensure_gathered(prefetch_->unit);
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].layer < 0) ensure_gathered(int(u));
    return;
  }
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
  // Every unit is out of date. The root's pages go until the next forward gathers it; the first
  // block's updated parameters start moving into the pages it kept, as under ZeRO-2 (any other
  // held block is released).
  const auto t0 = Clock::now();
  drop_held_except(unit_of(0));
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer < 0)
      release_params(int(u));
    else
      gathered_[u] = 0;
  prefetch(unit_of(0));
  return seconds_since(t0);
}

void ShardedParametersSync::adopt_params(bool whole_buffer) {
  if (whole_buffer) take_owned(params_.data(), owned_params_.data());
  held_ = -1;
  // Only the shards stay: the first forward gathers the root, and each block's hook its block.
  for (size_t u = 0; u < units_.size(); ++u) release_params(int(u));
}

}  // namespace trellis
