// ZeRO-3 (FSDP): ZeRO-2, and a block's parameters resident only while it runs: gathered before
// its forward and again before its backward (the next block prefetched meanwhile), released
// after. The root unit stays gathered.
#include <algorithm>

#include "trellis/core/clock.h"
#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ShardedParametersSync::ShardedParametersSync(Communicator& dp, const ParamLayout& layout)
    : ShardedGradientsSync(dp, layout) {}

ZeroFootprint ShardedParametersSync::footprint(const ParamLayout& layout, int dp, int dp_rank) {
  ZeroFootprint f = ShardedGradientsSync::footprint(layout, dp, dp_rank);
  f.params = f.grads;  // as the gradients: the root and two blocks
  return f;
}

void ShardedParametersSync::release_params(int u) {
  params_.release(units_[size_t(u)].begin, units_[size_t(u)].end);
  gathered_[size_t(u)] = 0;
}

void ShardedParametersSync::before_forward(int layer) {
  ensure_gathered(unit_of(layer));
  prefetch(unit_of(layer + 1));
}

void ShardedParametersSync::after_forward(int layer) { release_params(unit_of(layer)); }

void ShardedParametersSync::before_backward(int layer) {
  ShardedGradientsSync::before_backward(layer);
  if (layer < 0) return;
  ensure_gathered(unit_of(layer));
  prefetch(unit_of(layer - 1));
}

void ShardedParametersSync::after_backward(int layer) {
  if (layer >= 0) release_params(unit_of(layer));
  ShardedGradientsSync::after_backward(layer);
}

double ShardedParametersSync::gather_parameters() {
  const auto t0 = Clock::now();
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer < 0) gather_unit(int(u));
  return seconds_since(t0);
}

void ShardedParametersSync::adopt_params(bool whole_buffer) {
  if (whole_buffer) take_owned(params_.data(), owned_params_.data());
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer >= 0) release_params(int(u));
  if (!whole_buffer) gather_parameters();
}

}  // namespace trellis
