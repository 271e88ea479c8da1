#include "trellis/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis {

GradReduceDtype grad_reduce_dtype(const std::string& name) {
  TRELLIS_REQUIRE(name == "fp32" || name == "bf16",
                  "config key 'grad_reduce_dtype': unknown type '{}' (choose fp32 or bf16)", name);
  return name == "bf16" ? GradReduceDtype::Bf16 : GradReduceDtype::Fp32;
}

namespace {

// Blocks of the in-place conversions, copied through the stack: reading a block before writing
// it keeps either direction from overwriting what it has not read yet, and memcpy keeps the
// float and 16-bit views of one buffer apart for the compiler.
constexpr size_t kBlock = 2048;

// Rounds n floats at p; their bf16 bits take p's first 2n bytes (front to back: block k writes
// below where it reads).
uint16_t* pack_bf16_in_place(float* p, size_t n) {
  auto* bytes = reinterpret_cast<unsigned char*>(p);
  float in[kBlock];
  uint16_t out[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t k = std::min(kBlock, n - at);
    std::memcpy(in, bytes + at * sizeof(float), k * sizeof(float));
    ops::to_bf16(out, in, int64_t(k));
    std::memcpy(bytes + at * sizeof(uint16_t), out, k * sizeof(uint16_t));
  }
  return reinterpret_cast<uint16_t*>(p);
}

// Widens the n bf16 elements at the start of p into n floats at p (back to front: block k writes
// above what is left to read).
void unpack_bf16_in_place(float* p, size_t n) {
  auto* bytes = reinterpret_cast<unsigned char*>(p);
  uint16_t in[kBlock];
  float out[kBlock];
  for (size_t end = n; end > 0;) {
    const size_t at = end > kBlock ? end - kBlock : 0, k = end - at;
    std::memcpy(in, bytes + at * sizeof(uint16_t), k * sizeof(uint16_t));
    ops::from_bf16(out, in, int64_t(k));
    std::memcpy(bytes + at * sizeof(float), out, k * sizeof(float));
    end = at;
  }
}

// A bf16 collective whose result is widened into its fp32 buffer once it completes.
class WidenedWork final : public Work {
 public:
  WidenedWork(std::unique_ptr<Work> inner, float* out, size_t n)
      : inner_(std::move(inner)), out_(out), n_(n) {}
  void wait() override {
    inner_->wait();
    widen();
  }
  bool test() override {
    if (!done_ && inner_->test()) widen();
    return done_;
  }

 private:
  void widen() {
    if (done_) return;
    unpack_bf16_in_place(out_, n_);
    done_ = true;
  }
  std::unique_ptr<Work> inner_;
  float* out_;
  size_t n_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Work> all_reduce_grads(Communicator& c, float* buf, size_t n, GradReduceDtype t) {
  if (t == GradReduceDtype::Fp32 || c.size() == 1) return c.all_reduce_async(buf, n);
  auto inner = c.all_reduce_bf16_async(pack_bf16_in_place(buf, n), n);
  return std::make_unique<WidenedWork>(std::move(inner), buf, n);
}

std::unique_ptr<Work> reduce_scatter_grads(Communicator& c, float* send, float* recv, size_t count,
                                           GradReduceDtype t) {
  if (t == GradReduceDtype::Fp32 || c.size() == 1)
    return c.reduce_scatter_async(send, recv, count);
  return reduce_scatter_bf16_grads(c, pack_bf16_in_place(send, count * size_t(c.size())), recv,
                                   count);
}

std::unique_ptr<Work> reduce_scatter_bf16_grads(Communicator& c, const uint16_t* send, float* recv,
                                                size_t count) {
  auto inner = c.reduce_scatter_bf16_async(send, reinterpret_cast<uint16_t*>(recv), count);
  return std::make_unique<WidenedWork>(std::move(inner), recv, count);
}

GradReducer::GradReducer(Communicator& dp, float* grads, size_t n, size_t bucket_bytes,
                         std::vector<size_t> ready_points, GradReduceDtype dtype,
                         uint16_t* bits)
    : comm_(dp), grads_(grads), bits_(bits), n_(n), dtype_(dtype) {
  TRELLIS_CHECK(grads != nullptr || bits != nullptr || n == 0, "gradient buffer of {} is null", n);
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
    b.work = bits_ ? comm_.all_reduce_bf16_async(bits_ + b.begin, b.end - b.begin)
                   : all_reduce_grads(comm_, grads_ + b.begin, b.end - b.begin, dtype_);
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
