// ZeRO-0: replicas that all-reduce their gradients in buckets while backward runs.
#include <algorithm>
#include <vector>

#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ReplicatedSync::ReplicatedSync(Communicator& dp, const ParamLayout& layout, size_t bucket_bytes,
                               GradReduceDtype grad_dtype)
    : DataParallelSync(dp, layout, grad_dtype) {
  params_.commit(0, params_.size());
  grads_.commit(0, grads_.size());
  owned_ = {{0, n_}};
  // Backward reports each block's start as its gradients become final (the trainer's
  // on_block_done): the blocks' units begin there.
  std::vector<size_t> block_starts;
  for (const ZeroUnit& u : zero_units(layout))
    if (u.layer >= 0) block_starts.push_back(u.begin);
  if (dp_size_ > 1)
    reducer_ = std::make_unique<GradReducer>(dp, grads_.data(), n_, bucket_bytes, block_starts,
                                             grad_dtype);
}

ZeroFootprint ReplicatedSync::footprint(const ParamLayout& layout, int dp) {
  ZeroFootprint f;
  const size_t n = layout.size();
  f.params = f.grads = page_bytes(shard_range(n, dp, 0).padded);
  f.owned = int64_t(n);
  return f;
}

void ReplicatedSync::ready_from(size_t offset) {
  if (reducer_) reducer_->ready_from(offset);
}

void ReplicatedSync::begin_step() { std::fill_n(grads_.data(), grads_.size(), 0.0f); }

double ReplicatedSync::reduce_gradients() {
  if (!reducer_) return 0.0;
  reducer_->ready_from(0);  // whatever backward did not report yet
  reducer_->finish();
  return reducer_->exposed_seconds();
}

}  // namespace trellis
