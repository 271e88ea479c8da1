#include "trellis/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "trellis/core/error.h"

namespace trellis {

GradReducer::GradReducer(Communicator& dp, float* grads, size_t n, size_t bucket_bytes,
                         std::vector<size_t> ready_points)
    : comm_(dp), grads_(grads), n_(n) {
  TRELLIS_CHECK(grads != nullptr || n == 0, "gradient buffer of {} floats is null", n);
  // Boundaries depend only on (n, bucket_bytes, the layout's ready points), so every rank issues
  // the same all-reduces in the same order. Buckets are cut from the end: backward finishes the
  // last parameters first. A bucket that crossed a ready point would start only with the block
  // below it; the one holding the first block's top would wait for the end of backward, with
  // nothing left to hide it behind. A bucket that holds the whole buffer stays one all-reduce
  // after backward (what the benchmarks compare against).
  const size_t per = std::max<size_t>(1, bucket_bytes / sizeof(float));
  if (per >= n) ready_points.clear();
  std::sort(ready_points.begin(), ready_points.end(), std::greater<>());
  auto point = ready_points.begin();  // the highest not yet passed
  for (size_t end = n; end > 0;) {
    size_t begin = end > per ? end - per : 0;
    while (point != ready_points.end() && *point >= end) ++point;
    if (point != ready_points.end() && *point > begin) begin = *point;
    buckets_.push_back(Bucket{begin, end, nullptr, false});
    end = begin;
  }
}

void GradReducer::ready_from(size_t offset) {
  // Time inside the library counts as communication: OpenMPI does much of a non-blocking
  // all-reduce's work inside the calls that poll it.
  const auto t0 = std::chrono::steady_clock::now();
  while (next_ < buckets_.size() && buckets_[next_].begin >= offset) {
    Bucket& b = buckets_[next_++];
    b.work = comm_.all_reduce_async(grads_ + b.begin, b.end - b.begin);
    b.launched = true;
  }
  // Non-blocking collectives only advance while the library is entered: poll them here, unless
  // the communicator's progress thread does (then a poll would only wait for its locks).
  if (!comm_.progresses_by_itself())
    for (size_t i = 0; i < next_; ++i)
      if (buckets_[i].work) buckets_[i].work->test();
  polled_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradReducer::finish() {
  ready_from(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
    b.launched = false;
  }
  next_ = 0;
  exposed_s_ =
      polled_s_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  polled_s_ = 0.0;
}

}  // namespace trellis
