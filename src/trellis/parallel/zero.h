#pragma once
// How the data-parallel group shares gradients, optimizer state and parameters: one strategy per
// ZeRO stage behind DataParallelSync, made once from the config (make_data_parallel_sync) and then
// called by the trainer at fixed points of a step and, under ZeRO-2/3, by the model's block hooks:
//   replicated (ZeRO-0): bucketed all-reduce that overlaps backward (GradReducer), every rank
//                        updates all parameters (zero_replicated.cpp);
//   ZeRO-1:              one reduce-scatter after backward, each rank updates its shard of the
//                        parameters with its shard of the optimizer state, then all-gather
//                        (zero_sharded_optimizer.cpp);
//   ZeRO-2:              the buffer is cut into units (each block; the rest of the model is the
//                        root unit) and each unit is split evenly over the ranks. A unit's
//                        gradients are reduce-scattered as soon as backward finishes it (every
//                        micro-batch), added to this rank's compact shard and their pages
//                        returned; after the update the root unit is all-gathered, and each
//                        block in the next forward, one block ahead (its gather moves while
//                        the block before it computes; the first block's starts right after
//                        the update) (zero_sharded_gradients.cpp);
//   ZeRO-3 (FSDP):       as ZeRO-2, and a block's parameters are resident only while it runs:
//                        all-gathered before its forward and again before its backward (the
//                        next block prefetched meanwhile), released after, but a pass's last
//                        block stays for the next pass, which starts with it. The root unit
//                        (embeddings, final norm, head, which the first and last computations
//                        share) stays gathered, like FSDP's root module
//                        (zero_sharded_parameters.cpp).
// Units split evenly: a unit of len floats gives each rank len / dp of them (one in-place
// collective) and its last len % dp elements one each to the first ranks (a second, tiny one).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/memory.h"
#include "trellis/model/block_hooks.h"
#include "trellis/model/params.h"
#include "trellis/parallel/data_parallel.h"
#include "trellis/parallel/working_weights.h"

namespace trellis {

// The config's `zero` key (0, 1, 2, 3), parsed once: what the data-parallel group shards.
enum class ZeroStage { Replicated, ShardedOptimizer, ShardedGradients, ShardedParameters };
// Input error "zero must be 0, 1, 2 or 3 (got N)" for any other value.
ZeroStage zero_stage(int zero);

// ZeRO-1's partition of a flat buffer of n floats over dp ranks: padded to a multiple of dp, each
// rank owns [rank*shard, (rank+1)*shard) clipped to n. (Every strategy's buffers are padded so.)
struct ShardRange {
  size_t padded = 0, shard = 0, begin = 0, end = 0;
};
ShardRange shard_range(size_t n, int dp, int rank);

// ZeRO-2/3's units of a layout's buffer, in order: each block's tensors (layer >= 0) and the root
// pieces around them (layer -1).
struct ZeroUnit {
  size_t begin, end;
  int layer;
};
std::vector<ZeroUnit> zero_units(const ParamLayout& layout);
// Index into `units` of each block's unit, by layer; -1 for a layer not in them.
std::vector<int> unit_index_by_layer(const std::vector<ZeroUnit>& units);

// The bytes DataParallelSync holds at its peak within a step, for `--dry-run` and the planner, in
// the ZeRO paper's two kinds: model states, which persist from step to step (params: the weights
// every rank holds, ZeRO-3 the root's only; grads: the gradients kept, whole or this rank's shard;
// shards: ZeRO's compact fp32 master weights), and temporary buffers, which a step fills and
// empties (the fp32 gradient windows backward writes into, ZeRO-3's two gathered blocks, the
// collectives' outputs, staging and ring scratch). The optimizer's floats per state tensor cover
// its owned elements.
struct ZeroFootprint {
  int64_t params = 0, grads = 0, shards = 0;
  int64_t buffers = 0;
  int64_t owned = 0;  // elements
};
// Bytes of the fp32 gradient pages of the root units and `blocks` of the largest block units
// (each unit's floats and the partial pages at its two ends), at most the whole buffer's: what
// ZeRO-2/3 and ZeRO-0/1's bf16 gradient storage keep committed at once.
int64_t gradient_window_bytes(const ParamLayout& layout, int blocks);
// mixed: a bf16 run's mixed-precision state (mixed_precision_state); bf16_grads: ZeRO-0/1's bf16
// gradient storage (bf16_gradient_storage).
ZeroFootprint zero_footprint(const ParamLayout& layout, int dp, int dp_rank, ZeroStage stage,
                             bool mixed = false, bool bf16_grads = false);

// Whether a run keeps mixed-precision state (parallel/working_weights.h): in bf16 under ZeRO-1/2/3,
// fp32 master weights only in this rank's shard and bf16 working weights on every rank. ZeRO-0's
// replicas keep whole fp32 weights and the model's own bf16 copies.
bool mixed_precision_state(ZeroStage stage, bool bf16);

// Whether ZeRO-0/1 keep their gradients as bf16 (grad_reduce_dtype = bf16 on more than one
// data-parallel rank, without a pipeline; ZeRO-0 also without tensor parallelism): the ZeRO
// paper's 2-byte gradients. Backward writes a block's gradients into an fp32 window of its range,
// which is added into the bf16 buffer and returned when the block's backward ends (the root's when
// the micro-batch's does). A pipeline interleaves micro-batches across a block's backward, so it
// keeps fp32 gradients; so does ZeRO-0 under tensor parallelism (its sequence-parallel sums read
// the replicated tensors' gradients in fp32); ZeRO-2/3 keep fp32 shards (FSDP's
// keep_low_precision_grads = False). ZeRO-0's optimizer widens the reduced bits a chunk at a time
// (owned_grad_bits); ZeRO-1 widens its shard as the reduce-scatter completes.
bool bf16_gradient_storage(ZeroStage stage, GradReduceDtype grad_dtype, int dp, int tp, int pp);

class DataParallelSync {
 public:
  virtual ~DataParallelSync();

  // The flat buffers of the layout the model computes with (views into them stay valid).
  // ZeRO-3: only the root unit and the blocks being run hold parameters.
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  // What this rank updates and checkpoints: ranges of the layout's buffer, and the parameters and
  // reduced gradients of those ranges, compact (see FlatRange).
  const std::vector<FlatRange>& owned() const { return owned_; }
  // Whether owned() is this rank's shard of the group's state (ZeRO-1/2/3), so that a sum over it
  // (the gradient norm) needs the group; else every rank owns everything, as a replica.
  virtual bool sharded() const = 0;
  // Whether the owned pieces live apart from the flat buffers (ZeRO-2/3), so that a checkpoint can
  // be read into them alone; else they are the buffers' own range.
  virtual bool owned_apart() const { return false; }
  virtual float* owned_params() { return params_.data() + owned_[0].begin; }
  // Null where the owned gradients are kept as bf16 bits instead (owned_grad_bits).
  virtual float* owned_grads() { return grads_.data() + owned_[0].begin; }
  // ZeRO-0's bf16 gradient storage: the reduced gradients, compact, as bf16 bits; else null.
  virtual const uint16_t* owned_grad_bits() { return nullptr; }
  // Mixed precision: the bf16 working weights, laid out as params() (whose fp32 values then
  // exist for the fp32-read tensors only); null otherwise.
  const uint16_t* working_bits() { return working_ ? working_->bits() : nullptr; }

  // Whether backward should report finished gradients (ready_from) to overlap communication.
  virtual bool overlaps() const { return false; }
  // Backward hook (replicated): gradients in [offset, n) are final.
  virtual void ready_from(size_t /*offset*/) {}
  // The hooks the model calls around each block (ZeRO-2/3; null otherwise).
  virtual BlockHooks* hooks() { return nullptr; }

  // Before a step's first backward: gradients start from zero.
  virtual void begin_step() = 0;
  // After backward: the owned gradients hold the sum over the group. Returns the seconds spent
  // in communication not hidden behind backward (this step's block hooks included).
  virtual double reduce_gradients() = 0;
  // After the optimizer step updated the owned parameters: every rank gets them (ZeRO-1, 2: all of
  // the buffer; ZeRO-3: the root unit). Returns seconds.
  virtual double gather_parameters() = 0;

  // The parameters have just been written: the whole buffer (initialisation), or under ZeRO-2/3
  // only the owned pieces, compact (a checkpoint, read without materialising the model). Keeps the
  // owned pieces or gathers the rest from them; under ZeRO-3 the blocks end up released.
  virtual void adopt_params(bool /*whole_buffer*/) {}
  // The owned pieces of a whole buffer, compact.
  void take_owned(const float* whole, float* compact) const;
  // Bytes of the buffers this object holds now (parameters, gradients, compact shards).
  virtual int64_t resident_bytes() const;

 protected:
  // Maps the flat buffers (padded as ShardRange pads them), committing none of their pages.
  DataParallelSync(Communicator& dp, const ParamLayout& layout, GradReduceDtype grad_dtype);
  // Mixed precision: the working weights over these regions.
  void make_working(const ParamLayout& layout, std::vector<WorkingWeights::Region> regions);

  Communicator& dp_;
  const int dp_size_, dp_rank_;
  const size_t n_;  // floats of the layout's buffer
  const GradReduceDtype grad_dtype_;  // what the gradients cross the group in
  PageBuffer params_, grads_;
  std::vector<FlatRange> owned_;
  std::unique_ptr<WorkingWeights> working_;  // mixed precision only
};

// The strategy of `stage` over this rank's layout; bucket_bytes: the replicated all-reduce's
// bucket size; mixed: mixed_precision_state; grad_dtype: grad_reduce_dtype (every stage's
// gradient reductions, fp32 in and out of them); bf16_grads: bf16_gradient_storage.
std::unique_ptr<DataParallelSync> make_data_parallel_sync(
    Communicator& dp, ZeroStage stage, const ParamLayout& layout, size_t bucket_bytes,
    bool mixed = false, GradReduceDtype grad_dtype = GradReduceDtype::Fp32,
    bool bf16_grads = false);

}  // namespace trellis
