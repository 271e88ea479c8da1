#pragma once
// How the data-parallel group shares gradients, optimizer state and parameters (chosen once from
// the config, then called by the trainer at fixed points of a step and by the model's block
// hooks):
//   replicated (ZeRO-0): bucketed all-reduce that overlaps backward (GradReducer), every rank
//                        updates all parameters;
//   ZeRO-1:              one reduce-scatter after backward, each rank updates its shard of the
//                        parameters with its shard of the optimizer state, then all-gather;
//   ZeRO-2:              the buffer is cut into units (each block; the rest of the model is the
//                        root unit) and each unit is split evenly over the ranks. A unit's
//                        gradients are reduce-scattered as soon as backward finishes it (every
//                        micro-batch), added to this rank's compact shard and their pages
//                        returned; after the update every unit is all-gathered;
//   ZeRO-3 (FSDP):       as ZeRO-2, and a block's parameters are resident only while it runs:
//                        all-gathered before its forward and again before its backward (the
//                        next block prefetched meanwhile), released after. The root unit
//                        (embeddings, final norm, head, which the first and last computations
//                        share) stays gathered, like FSDP's root module.
// Units split evenly: a unit of len floats gives each rank len / dp of them (one in-place
// collective) and its last len % dp elements one each to the first ranks (a second, tiny one).
#include <cstddef>
#include <memory>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/memory.h"
#include "trellis/model/params.h"
#include "trellis/model/block_hooks.h"
#include "trellis/parallel/data_parallel.h"

namespace trellis {

// ZeRO-2/3's units of a layout's buffer, in order: each block's tensors (layer >= 0) and the root
// pieces around them (layer -1).
struct ZeroUnit {
  size_t begin, end;
  int layer;
};
std::vector<ZeroUnit> zero_units(const ParamLayout& layout);

// The bytes DataParallelSync holds at its peak within a step, for `--dry-run` and the planner:
// the parameter and gradient buffers as resident (ZeRO-3: the root and two blocks, the one running
// and the one prefetched or being reduced), the compact shards and communication staging, and the
// optimizer's floats per state tensor (its owned elements).
struct ZeroFootprint {
  int64_t params = 0, grads = 0, shards = 0;
  int64_t owned = 0;  // elements
};
ZeroFootprint zero_footprint(const ParamLayout& layout, int dp, int dp_rank, int zero);

class DataParallelSync : private BlockHooks {
 public:
  DataParallelSync(Communicator& dp, int zero, const ParamLayout& layout, size_t bucket_bytes);
  ~DataParallelSync();

  // The flat buffers of the layout the model computes with (views into them stay valid).
  // ZeRO-3: only the root unit and the blocks being run hold parameters.
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  int zero() const { return zero_; }
  // What this rank updates and checkpoints: ranges of the layout's buffer, and the parameters and
  // reduced gradients of those ranges, compact (see FlatRange).
  const std::vector<FlatRange>& owned() const { return owned_; }
  float* owned_params();
  float* owned_grads();

  // Whether backward should report finished gradients (ready_from) to overlap communication.
  bool overlaps() const { return reducer_ != nullptr; }
  // Backward hook (replicated): gradients in [offset, n) are final.
  void ready_from(size_t offset);
  // The model's per-block hooks (ZeRO-2/3; null otherwise).
  BlockHooks* hooks() { return zero_ >= 2 ? this : nullptr; }

  // Before a step's first backward: gradients start from zero.
  void begin_step();
  // After backward: the owned gradients hold the sum over the group. Returns the seconds spent
  // in communication not hidden behind backward (this step's block hooks included).
  double reduce_gradients();
  // After the optimizer step updated the owned parameters: every rank gets them (ZeRO-1, 2: all of
  // the buffer; ZeRO-3: the root unit). Returns seconds.
  double gather_parameters();

  // The parameters have just been written: the whole buffer (initialisation), or under ZeRO-2/3
  // only the owned pieces, compact (a checkpoint, read without materialising the model). Keeps the
  // owned pieces or gathers the rest from them; under ZeRO-3 the blocks end up released.
  void adopt_params(bool whole_buffer);
  // The owned pieces of a whole buffer, compact.
  void take_owned(const float* whole, float* compact) const;
  // Bytes of the buffers this object holds now (parameters, gradients, compact shards).
  int64_t resident_bytes() const;

 private:
  struct Unit {
    size_t begin, end;  // of the layout's buffer
    size_t chunk;       // (end - begin) / dp: floats per rank in the even part
    int layer;          // block index, -1: a piece of the root
    size_t owned_at;    // compact offset of this rank's part
  };
  size_t main_end(const Unit& u) const { return u.begin + u.chunk * size_t(dp_size_); }
  size_t rest(const Unit& u) const { return u.end - main_end(u); }
  size_t owned_size(const Unit& u) const { return u.chunk + (size_t(dp_rank_) < rest(u) ? 1 : 0); }
  void build_units(const ParamLayout& layout);
  // ZeRO-2/3 collectives on one unit. A gather is started (its even share and its rest
  // elements) and finished (waited for, the rest placed, the unit marked gathered).
  struct Gather;
  std::unique_ptr<Gather> start_gather(int u);
  void finish_gather(Gather& g);
  void gather_unit(int u);
  void launch_reduce(int u);
  void finish_oldest();
  void finish_reductions();
  int unit_of(int layer) const;  // -1: not in this layout
  // Block hooks (ZeRO-2/3).
  void before_forward(int layer) override;
  void after_forward(int layer) override;
  void before_backward(int layer) override;
  void after_backward(int layer) override;
  void ensure_gathered(int u);
  void prefetch(int u);

  Communicator& dp_;
  int zero_, dp_size_, dp_rank_;
  size_t n_;
  PageBuffer params_, grads_;
  std::vector<FlatRange> owned_;
  ShardRange shard_;  // ZeRO-1
  std::unique_ptr<GradReducer> reducer_;
  std::vector<float> staging_;  // ZeRO-1: one shard
  // ZeRO-2/3
  std::vector<Unit> units_;
  std::vector<int> unit_of_layer_;  // by layer; -1: not in this layout
  std::vector<float> owned_params_, owned_grads_;
  std::vector<char> gathered_;  // per unit (ZeRO-3)
  bool first_micro_ = true;     // the first backward of the step writes the shards
  struct Reduction {
    int unit = -1;
    std::vector<float> out;      // this rank's reduced part (main chunk + rest element)
    std::vector<float> rest_in;  // the padded rest: dp floats
    std::unique_ptr<Work> main, tail;
  };
  std::vector<std::unique_ptr<Reduction>> in_flight_;  // oldest first
  struct Gather {
    int unit = -1;
    std::unique_ptr<Work> main, tail;
    std::vector<float> rest_in, rest_out;
  };
  std::unique_ptr<Gather> prefetch_;  // the next block's parameters (ZeRO-3)
  double hook_comm_s_ = 0.0;  // exposed seconds inside the hooks this step
};

}  // namespace trellis
