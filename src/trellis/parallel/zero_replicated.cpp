// ZeRO-0: replicas that all-reduce their gradients in buckets while backward runs.
#include <algorithm>
#include <vector>

#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ReplicatedSync::ReplicatedSync(Communicator& dp, const ParamLayout& layout, size_t bucket_bytes,
                               GradReduceDtype grad_dtype, bool bf16_grads)
    : DataParallelSync(dp, layout, grad_dtype) {
  params_.commit(0, params_.size());
  owned_ = {{0, n_}};
  // bf16 gradients: the fp32 pages stay uncommitted outside the windows the hooks open.
  if (bf16_grads)
    bits_ = std::make_unique<Bf16GradientBits>(layout, grads_.size());
  else
    grads_.commit(0, grads_.size());
  // Backward reports each block's start as its gradients become final (the trainer's
  // on_block_done, after the block's hooks have folded them): the blocks' units begin there.
  std::vector<size_t> block_starts;
  for (const ZeroUnit& u : zero_units(layout))
    if (u.layer >= 0) block_starts.push_back(u.begin);
  if (dp_size_ > 1)
    reducer_ = std::make_unique<GradReducer>(dp, bits_ ? nullptr : grads_.data(), n_,
                                             bucket_bytes, block_starts, grad_dtype,
                                             bits_ ? bits_->data() : nullptr);
}

ZeroFootprint ReplicatedSync::footprint(const ParamLayout& layout, int dp, bool bf16_grads) {
  ZeroFootprint f;
  const size_t padded = shard_range(layout.size(), dp, 0).padded;
  f.params = f.grads = page_bytes(padded);
  if (bf16_grads) Bf16GradientBits::footprint(f, layout, padded);
  f.owned = int64_t(layout.size());
  return f;
}

void ReplicatedSync::ready_from(size_t offset) {
  if (reducer_) reducer_->ready_from(offset);
}

void ReplicatedSync::begin_step() {
  if (bits_)
    bits_->clear();
  else
    std::fill_n(grads_.data(), grads_.size(), 0.0f);
}

double ReplicatedSync::reduce_gradients() {
  if (!reducer_) return 0.0;
  reducer_->ready_from(0);  // whatever backward did not report yet
  reducer_->finish();
  return reducer_->exposed_seconds();
}

int64_t ReplicatedSync::resident_bytes() const {
  return DataParallelSync::resident_bytes() + (bits_ ? bits_->bytes() : 0);
}

}  // namespace trellis
