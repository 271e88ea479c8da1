#pragma once
// Gradient reducer of replicated data parallelism (ZeRO-0 in parallel/zero.h; PyTorch DDP's
// Reducer, simplified): the flat gradient buffer is cut into buckets from its end (the order in
// which backward finishes gradients), also at every point where backward reports gradients final
// (each block's start), and each bucket's all-reduce is launched as soon as its gradients are
// final, overlapping backward.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trellis/comm/communicator.h"

namespace trellis {

// The element type gradients cross the data-parallel group in (`grad_reduce_dtype`): fp32, or
// bf16 for half the bytes (PyTorch DDP's bf16 compression hook, Megatron's bf16 reduction). A
// bf16 reduction rounds the fp32 gradients to bf16, sums them in fp32 and rounds each partial sum
// (Communicator's bf16 reductions), and widens the result back into the fp32 buffer: storage,
// accumulation over micro-batches and the optimizer stay fp32 (but ZeRO-0/1's storage:
// bf16_gradient_storage in parallel/zero.h).
enum class GradReduceDtype : uint8_t { Fp32, Bf16 };
// Input error naming the key for anything but "fp32" or "bf16".
GradReduceDtype grad_reduce_dtype(const std::string& name);

// Gradient collectives in that type, fp32 in and out, no extra memory: the bf16 bits are written
// over the first half of the fp32 input and the result widened in place on completion (test() or
// wait()). In place over buf's n floats; and rank r's block of send (size() blocks of count
// floats; under bf16 send's values are consumed) into recv (count floats, apart from send).
std::unique_ptr<Work> all_reduce_grads(Communicator& c, float* buf, size_t n, GradReduceDtype t);
std::unique_ptr<Work> reduce_scatter_grads(Communicator& c, float* send, float* recv, size_t count,
                                           GradReduceDtype t);
// The same from gradients kept as bf16 bits (ZeRO-1's bf16 storage): recv widened on completion.
std::unique_ptr<Work> reduce_scatter_bf16_grads(Communicator& c, const uint16_t* send, float* recv,
                                                size_t count);

class GradReducer {
 public:
  // grads: the flat gradient buffer of n floats; bucket_bytes: the largest bucket; ready_points:
  // the offsets ready_from will be called with (a bucket never spans one, so none waits for
  // gradients finished later than most of it), unless bucket_bytes holds all n floats: then one
  // bucket, launched when backward ends. bits: gradients kept as bf16 bits instead (ZeRO-0's
  // bf16 storage; grads null), each bucket's all-reduced as they are.
  GradReducer(Communicator& dp, float* grads, size_t n, size_t bucket_bytes,
              std::vector<size_t> ready_points = {},
              GradReduceDtype dtype = GradReduceDtype::Fp32, uint16_t* bits = nullptr);
  // Called during the last micro-batch's backward: gradients in [offset, n) are final. Launches
  // every bucket that lies entirely inside that range and polls in-flight ones for progress.
  void ready_from(size_t offset);
  // Launches the remaining buckets and waits for all. Afterwards grads hold the sum over ranks.
  void finish();
  // Seconds this rank spent inside communication calls in the last step (launching and polling
  // during backward, waiting in finish()): the part not hidden behind computation.
  double exposed_seconds() const { return exposed_s_; }
  size_t bucket_count() const { return buckets_.size(); }

 private:
  struct Bucket {
    size_t begin, end;
    std::unique_ptr<Work> work;
    bool launched = false;
  };
  Communicator& comm_;
  float* grads_;
  uint16_t* bits_;
  size_t n_;
  GradReduceDtype dtype_;
  std::vector<Bucket> buckets_;  // buckets_[0] ends at n (launched first)
  size_t next_ = 0;              // next bucket to launch
  double exposed_s_ = 0.0, polled_s_ = 0.0;
};

}  // namespace trellis
