#pragma once
// How the data-parallel group shares gradients and optimizer state (chosen once from the config,
// then called by the trainer at fixed points of a step):
//   replicated (ZeRO-0): bucketed all-reduce that overlaps backward (GradReducer), every rank
//                        updates all parameters;
//   ZeRO-1:              one reduce-scatter after backward, each rank updates its shard of the
//                        parameters with its shard of the optimizer state, then all-gather.
#include <cstddef>
#include <memory>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/parallel/data_parallel.h"

namespace trellis {

class DataParallelSync {
 public:
  // params/grads: flat buffers of buffer_size(n, dp, zero) floats whose first n are the model.
  DataParallelSync(Communicator& dp, int zero, float* params, float* grads, size_t n,
                   size_t bucket_bytes);
  static size_t buffer_size(size_t n, int dp, int zero);
  // The slice of the buffer this rank's optimizer updates (all of it without ZeRO).
  const ShardRange& shard() const { return shard_; }
  int zero() const { return zero_; }
  // Whether backward should report finished gradients (ready_from) to overlap communication.
  bool overlaps() const { return reducer_ != nullptr; }
  // Backward hook: gradients in [offset, n) are final.
  void ready_from(size_t offset);
  // After backward: gradients of this rank's shard hold the sum over the group. Returns the
  // seconds spent in communication not hidden behind backward.
  double reduce_gradients();
  // After the optimizer step (ZeRO): every rank gets the updated parameters. Returns seconds.
  double gather_parameters();
  // The whole buffer of a state vector that covers this rank's shard (checkpoints).
  std::vector<float> gather_state(const std::vector<float>& shard_state) const;

 private:
  Communicator& dp_;
  int zero_;
  float *params_, *grads_;
  size_t n_;
  ShardRange shard_;
  std::unique_ptr<GradReducer> reducer_;
  std::vector<float> staging_;  // one shard, for reduce-scatter and all-gather
};

}  // namespace trellis
