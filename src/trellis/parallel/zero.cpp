#include "trellis/parallel/zero.h"

#include <algorithm>
#include <chrono>

#include "trellis/core/error.h"

namespace trellis {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

size_t DataParallelSync::buffer_size(size_t n, int dp, int zero) {
  return zero ? shard_range(n, dp, 0).padded : n;
}

DataParallelSync::DataParallelSync(Communicator& dp, int zero, float* params, float* grads,
                                   size_t n, size_t bucket_bytes)
    : dp_(dp), zero_(zero), params_(params), grads_(grads), n_(n) {
  TRELLIS_REQUIRE(zero == 0 || zero == 1, "zero must be 0 or 1 (got {})", zero);
  shard_ = zero ? shard_range(n, dp.size(), dp.rank()) : ShardRange{n, n, 0, n};
  if (dp.size() > 1 && zero == 0)
    reducer_ = std::make_unique<GradReducer>(dp, grads, n, bucket_bytes);
  if (zero) staging_.assign(shard_.shard, 0.0f);
}

void DataParallelSync::ready_from(size_t offset) {
  if (reducer_) reducer_->ready_from(offset);
}

double DataParallelSync::reduce_gradients() {
  if (reducer_) {
    reducer_->ready_from(0);  // whatever backward did not report yet
    reducer_->finish();
    return reducer_->exposed_seconds();
  }
  if (!zero_ || dp_.size() == 1) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  dp_.reduce_scatter_async(grads_, staging_.data(), shard_.shard)->wait();
  std::copy_n(staging_.data(), shard_.end - shard_.begin, grads_ + shard_.begin);
  return seconds_since(t0);
}

double DataParallelSync::gather_parameters() {
  if (!zero_ || dp_.size() == 1) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  std::copy_n(params_ + shard_.begin, shard_.end - shard_.begin, staging_.data());
  dp_.all_gather_async(staging_.data(), params_, shard_.shard)->wait();
  return seconds_since(t0);
}

std::vector<float> DataParallelSync::gather_state(const std::vector<float>& shard_state) const {
  if (!zero_) return shard_state;
  std::vector<float> mine(shard_.shard, 0.0f), all(shard_.padded, 0.0f);
  std::copy(shard_state.begin(), shard_state.end(), mine.begin());
  dp_.all_gather_async(mine.data(), all.data(), shard_.shard)->wait();
  all.resize(n_);
  return all;
}

}  // namespace trellis
