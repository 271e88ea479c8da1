#pragma once
// Megatron-style tensor parallelism: the conjugate operators that bracket a column-parallel →
// row-parallel pair, for activations stored as [rows, C] row-major. Without sequence parallelism
// the regions outside are replicated: entering is the identity forward and an all-reduce
// backward (Megatron's f), leaving is an all-reduce forward and the identity backward (g). With
// sequence parallelism the outside regions hold a slice of the rows instead: entering all-gathers
// (its backward reduce-scatters) and leaving reduce-scatters (its backward all-gathers).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "trellis/kernels/ops.h"

namespace trellis {

class Communicator;

class TensorParallel {
 public:
  // comm == nullptr or of size 1: a single rank, every operator is the identity.
  TensorParallel(Communicator* comm, bool sequence_parallel);
  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sp_; }

  // Rows this rank holds outside tensor-parallel regions, and the first of them.
  int64_t local_rows(int64_t rows) const { return sp_ ? rows / size_ : rows; }
  int64_t first_row(int64_t rows) const { return sp_ ? local_rows(rows) * rank_ : 0; }

  // Entering a region: returns the full [rows, C] input of the column-parallel layer (`full` is
  // used as storage only under sequence parallelism).
  const float* enter(const float* local, float* full, int64_t rows, int64_t C);
  // Backward of enter: dfull holds this rank's partial gradient of the full input; leaves the
  // summed gradient of this rank's rows in dlocal (which may be dfull itself when not SP).
  void enter_backward(float* dfull, float* dlocal, int64_t rows, int64_t C);
  // Leaving a region: partial holds this rank's partial [rows, C] output of the row-parallel
  // layer; leaves the summed output of this rank's rows in out (which may be partial when not SP).
  void leave(float* partial, float* out, int64_t rows, int64_t C);
  // Backward of leave: returns the full [rows, C] gradient (`dfull` is storage under SP only).
  const float* leave_backward(const float* dlocal, float* dfull, int64_t rows, int64_t C);

  // Sums every piece over the group in place, packed into one all-reduce; the same pieces in the
  // same order on every rank. (parallel/replicated_grads picks the pieces: which parameters are
  // replicated is the model's layout, which sits above these operators.)
  void all_reduce_pieces(const std::vector<std::span<float>>& pieces);
  // Row statistics combine for the vocabulary-parallel cross-entropy.
  ops::RowCombine row_combine();
  // Seconds spent in tensor-parallel communication since the last call (for the step breakdown).
  double take_comm_seconds();

 private:
  Communicator* comm_;
  int size_ = 1, rank_ = 0;
  bool sp_ = false;
  double comm_s_ = 0.0;
  std::vector<float> packed_;
};

}  // namespace trellis
