#pragma once
// The four DataParallelSync strategies (parallel/zero.h says what each does); only
// make_data_parallel_sync and zero_footprint name them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "trellis/parallel/data_parallel.h"
#include "trellis/parallel/zero.h"

namespace trellis {

// Bytes of the whole pages that hold `floats` floats.
int64_t page_bytes(size_t floats);
// Beyond 2 ranks the MPI backend's ring reduce-scatter holds a scratch block the size of its
// output while it runs (comm/mpi_backend.cpp): 1, else 0.
int64_t ring_scratch_blocks(int dp);

// bf16 gradient storage (bf16_gradient_storage): the padded buffer's gradients as bf16 bits.
// Backward writes a unit's fp32 gradients into its window of the fp32 buffer, whose pages are
// committed before the unit's backward (open) and, after it, added into the bits (rounded once a
// micro-batch) and returned (fold). Layer -1 is the root units, which a micro-batch's backward
// opens before the head; a block's fold also folds the root units above it, the embeddings' fold
// the rest.
class Bf16GradientBits {
 public:
  Bf16GradientBits(const ParamLayout& layout, size_t padded);
  uint16_t* data() { return bits_.data(); }
  void clear() { std::fill(bits_.begin(), bits_.end(), uint16_t{0}); }
  void open(int layer, PageBuffer& grads);
  void fold(int layer, PageBuffer& grads);
  int64_t bytes() const { return int64_t(bits_.size() * sizeof(uint16_t)); }
  // For the memory model: the bits of a padded buffer (f.grads) and the fp32 windows of the root
  // and the block in backward (added to f.buffers).
  static void footprint(ZeroFootprint& f, const ParamLayout& layout, size_t padded);

 private:
  std::vector<uint16_t> bits_;
  std::vector<ZeroUnit> units_;
  std::vector<int> unit_of_layer_;  // index into units_ by layer; -1: not in this layout
  std::vector<char> open_;          // per unit: its window is committed and not yet folded
};

// ZeRO-0: every rank holds and updates everything; gradients are all-reduced in buckets while
// backward runs. bf16 gradients (bf16_gradient_storage): the buckets are ranges of the bits, each
// all-reduced as bf16 once backward has folded it, and the optimizer widens them as it reads.
class ReplicatedSync final : public DataParallelSync, public BlockHooks {
 public:
  ReplicatedSync(Communicator& dp, const ParamLayout& layout, size_t bucket_bytes,
                 GradReduceDtype grad_dtype, bool bf16_grads);
  static ZeroFootprint footprint(const ParamLayout& layout, int dp, bool bf16_grads);

  bool sharded() const override { return false; }
  bool overlaps() const override { return reducer_ != nullptr; }
  float* owned_grads() override { return bits_ ? nullptr : DataParallelSync::owned_grads(); }
  const uint16_t* owned_grad_bits() override { return bits_ ? bits_->data() : nullptr; }
  BlockHooks* hooks() override { return bits_ ? this : nullptr; }
  void ready_from(size_t offset) override;
  void begin_step() override;
  double reduce_gradients() override;
  double gather_parameters() override { return 0.0; }
  int64_t resident_bytes() const override;

  void before_backward(int layer) override { bits_->open(layer, grads_); }
  void after_backward(int layer) override { bits_->fold(layer, grads_); }

 private:
  std::unique_ptr<Bf16GradientBits> bits_;  // bf16 gradients only
  std::unique_ptr<GradReducer> reducer_;    // null on one rank
};

// ZeRO-1: whole buffers on every rank; the optimizer state and update of one shard_range each.
// Mixed precision: the fp32 masters of the shard apart (owned_params), bf16 working weights whole.
// bf16 gradients (bf16_gradient_storage): the block hooks fold each unit's fp32 window into the
// bits, which are reduce-scattered as bf16 into the shard (owned_grads).
class ShardedOptimizerSync final : public DataParallelSync, public BlockHooks {
 public:
  ShardedOptimizerSync(Communicator& dp, const ParamLayout& layout, bool mixed,
                       GradReduceDtype grad_dtype, bool bf16_grads);
  static ZeroFootprint footprint(const ParamLayout& layout, int dp, int dp_rank, bool mixed,
                                 bool bf16_grads);

  bool sharded() const override { return true; }
  bool owned_apart() const override { return working_ != nullptr; }
  float* owned_params() override {
    return working_ ? masters_.data() : DataParallelSync::owned_params();
  }
  float* owned_grads() override {
    return bits_ ? staging_.data() : DataParallelSync::owned_grads();
  }
  BlockHooks* hooks() override { return bits_ ? this : nullptr; }
  void begin_step() override;
  double reduce_gradients() override;
  double gather_parameters() override;
  void adopt_params(bool whole_buffer) override;
  int64_t resident_bytes() const override;

  // bf16 gradients: a unit's fp32 window is committed before its backward and folded after.
  void before_backward(int layer) override { bits_->open(layer, grads_); }
  void after_backward(int layer) override { bits_->fold(layer, grads_); }

 private:
  ShardRange shard_;
  std::vector<float> staging_;  // one shard: the reduce-scatter's output, the all-gather's input
  std::vector<float> masters_;  // mixed: the shard's fp32 master weights (shard_.shard floats)
  std::unique_ptr<Bf16GradientBits> bits_;  // bf16 gradients only
};

// ZeRO-2: gradients reduce-scattered per unit as backward finishes it, into compact shards.
// ZeRO-3 adds the parameters' residency on top (ShardedParametersSync).
class ShardedGradientsSync : public DataParallelSync, public BlockHooks {
 public:
  ShardedGradientsSync(Communicator& dp, const ParamLayout& layout, bool mixed,
                       GradReduceDtype grad_dtype);
  static ZeroFootprint footprint(const ParamLayout& layout, int dp, int dp_rank, bool mixed);

  bool sharded() const override { return true; }
  bool owned_apart() const override { return true; }
  float* owned_params() override { return owned_params_.data(); }
  float* owned_grads() override { return owned_grads_.data(); }
  BlockHooks* hooks() override { return this; }
  void begin_step() override;
  double reduce_gradients() override;
  double gather_parameters() override;
  void adopt_params(bool whole_buffer) override;
  int64_t resident_bytes() const override;

  // Block hooks: a block's parameters, all-gathered after the last update, are waited for before
  // its forward, which prefetches the next block's; a unit's gradient pages are committed before
  // backward writes them and reduce-scattered (then returned) after.
  void before_forward(int layer) override;
  void before_backward(int layer) override;
  void after_backward(int layer) override;

 protected:
  struct Unit {
    size_t begin, end;  // of the layout's buffer
    size_t chunk;       // (end - begin) / dp: floats per rank in the even part
    int layer;          // block index, -1: a piece of the root
    size_t owned_at;    // compact offset of this rank's part
  };
  size_t main_end(const Unit& u) const { return u.begin + u.chunk * size_t(dp_size_); }
  size_t rest(const Unit& u) const { return u.end - main_end(u); }
  size_t owned_size(const Unit& u) const { return u.chunk + (size_t(dp_rank_) < rest(u) ? 1 : 0); }
  int unit_of(int layer) const;  // -1: not in this layout

  // A unit's all-gather, started (its even share and its rest elements) and finished (waited
  // for, the rest placed).
  struct Gather {
    int unit = -1;
    std::unique_ptr<Work> main, tail;
    std::vector<float> rest_in, rest_out;
    std::unique_ptr<WorkingWeights::Gather> working;  // mixed precision: instead of the above
  };
  std::unique_ptr<Gather> start_gather(int u);
  void finish_gather(Gather& g);
  void gather_unit(int u);
  // Unit u's parameters are current: waits for its prefetched gather, or gathers it now.
  void ensure_gathered(int u);
  // Starts unit u's gather (u < 0: none), after finishing the one prefetched before it.
  void prefetch(int u);
  // Gathers the root units now; every block's parameters are out of date until gathered again.
  void gather_root();

  std::vector<Unit> units_;
  std::vector<float> owned_params_, owned_grads_;
  double hook_comm_s_ = 0.0;          // exposed seconds inside the hooks this step
  std::vector<char> gathered_;        // per unit: its parameters are current in params_
  std::unique_ptr<Gather> prefetch_;  // the next block's parameters, in flight

 private:
  void build_units(const ParamLayout& layout);
  void launch_reduce(int u);
  void finish_oldest();
  void finish_reductions();

  std::vector<int> unit_of_layer_;  // by layer; -1: not in this layout
  bool first_micro_ = true;         // the first backward of the step writes the shards
  struct Reduction {
    int unit = -1;
    std::vector<float> out;      // this rank's reduced part (main chunk + rest element)
    std::vector<float> rest_in;  // the padded rest: dp floats
    std::unique_ptr<Work> main, tail;
  };
  std::vector<std::unique_ptr<Reduction>> in_flight_;  // oldest first
};

// ZeRO-3: ZeRO-2, and each block's parameters gathered around its forward and its backward.
// A pass's last block stays gathered into the pass that starts with it (the last block from its
// forward into its backward, the first from its backward into the next forward), as FSDP keeps
// the last block it ran: that gather would be the one nothing was prefetched before. The root is
// gathered when a forward opens and released at the update, as FSDP reshards everything after
// backward: between steps a rank holds its shards only.
class ShardedParametersSync final : public ShardedGradientsSync {
 public:
  ShardedParametersSync(Communicator& dp, const ParamLayout& layout, bool mixed,
                        GradReduceDtype grad_dtype);
  static ZeroFootprint footprint(const ParamLayout& layout, int dp, int dp_rank, bool mixed);

  double gather_parameters() override;
  void adopt_params(bool whole_buffer) override;

  void before_forward(int layer) override;
  void after_forward(int layer) override;
  void before_backward(int layer) override;
  void after_backward(int layer) override;

 private:
  void release_params(int u);
  // Keeps unit u gathered past its pass (held_), or releases it.
  void hold_or_release(int u, bool hold);
  // Releases the held unit unless it is u, the one about to run.
  void drop_held_except(int u);

  int held_ = -1;  // a block kept gathered for the pass that starts with it; -1: none
};

}  // namespace trellis
