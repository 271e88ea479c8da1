#include "trellis/tensor_parallel/operators.h"

#include <algorithm>
#include <chrono>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"

namespace trellis {

namespace {
// Adds the lifetime of the scope to a seconds counter.
class CommTimer {
 public:
  explicit CommTimer(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~CommTimer() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

TensorParallel::TensorParallel(Communicator* comm, bool sequence_parallel)
    : comm_(comm && comm->size() > 1 ? comm : nullptr) {
  if (comm_) {
    size_ = comm_->size();
    rank_ = comm_->rank();
  }
  sp_ = sequence_parallel && size_ > 1;
}

const float* TensorParallel::enter(const float* local, float* full, int64_t rows, int64_t C) {
  if (!sp_) return local;
  CommTimer timer(comm_s_);
  comm_->all_gather_async(local, full, size_t(local_rows(rows) * C))->wait();
  return full;
}

// The operators are conjugate pairs: entering's backward is leaving's forward (sum the partial
// gradients, keep this rank's rows) and leaving's backward is entering's forward.
void TensorParallel::enter_backward(float* dfull, float* dlocal, int64_t rows, int64_t C) {
  leave(dfull, dlocal, rows, C);
}

void TensorParallel::leave(float* partial, float* out, int64_t rows, int64_t C) {
  CommTimer timer(comm_s_);
  if (sp_) {
    comm_->reduce_scatter_async(partial, out, size_t(local_rows(rows) * C))->wait();
    return;
  }
  if (comm_) comm_->all_reduce(partial, size_t(rows * C));
  if (out != partial) std::copy_n(partial, rows * C, out);
}

const float* TensorParallel::leave_backward(const float* dlocal, float* dfull, int64_t rows,
                                            int64_t C) {
  return enter(dlocal, dfull, rows, C);
}

void TensorParallel::all_reduce_pieces(const std::vector<std::span<float>>& pieces) {
  if (!comm_) return;
  CommTimer timer(comm_s_);
  packed_.clear();
  for (std::span<float> piece : pieces) packed_.insert(packed_.end(), piece.begin(), piece.end());
  comm_->all_reduce(packed_.data(), packed_.size());
  const float* p = packed_.data();
  for (std::span<float> piece : pieces) {
    std::copy_n(p, piece.size(), piece.data());
    p += piece.size();
  }
}

ops::RowCombine TensorParallel::row_combine() {
  if (!comm_) return {};
  return [this](double* buf, int64_t n, bool is_max) {
    CommTimer timer(comm_s_);
    if (is_max)
      comm_->all_reduce_max(buf, size_t(n));
    else
      comm_->all_reduce_sum(buf, size_t(n));
  };
}

double TensorParallel::take_comm_seconds() {
  const double s = comm_s_;
  comm_s_ = 0.0;
  return s;
}

}  // namespace trellis
