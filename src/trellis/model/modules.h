#pragma once
// The building blocks a Transformer is composed of, as views of this rank's parameters and
// gradients with explicit forward/backward through the kernel backend. No communication here.
#include <cstdint>
#include <vector>

#include "trellis/kernels/backend.h"
#include "trellis/model/params.h"

namespace trellis {

// A linear layer y[rows, out] = x[rows, in] W (+ b). Its weight is one tensor or several pieces
// that write consecutive column ranges of y (q|k|v, gate|up), each stored [in, out] or [out, in].
class Linear {
 public:
  Linear() = default;
  // The pieces are the tensors of `slots` in block `layer`, in order.
  Linear(const Backend& k, const ParamLayout& layout, std::vector<Slot> slots, int layer,
         float* params, float* grads);
  bool empty() const { return pieces_.empty(); }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // Adds the bias only when add_bias (a row-parallel layer adds it after summing its partials).
  void forward(float* y, const float* x, int64_t rows, bool add_bias = true) const;
  // dx (may be null) is written (not accumulated: no zero-fill needed before); the parameter
  // gradients accumulate.
  void backward(float* dx, const float* dy, const float* x, int64_t rows,
                bool bias_grad = true) const;
  // backward's two independent halves (a split backward runs them apart): dx, then the weight
  // (and bias) gradients.
  void backward_input(float* dx, const float* dy, int64_t rows) const;
  void backward_weights(const float* dy, const float* x, int64_t rows, bool bias_grad = true) const;
  const float* bias() const { return pieces_.size() == 1 ? pieces_[0].b : nullptr; }
  float* bias_grad() const { return pieces_.size() == 1 ? pieces_[0].db : nullptr; }

 private:
  struct Piece {
    const float* w;
    float* dw;
    const float* b;
    float* db;
    int64_t col, cols;  // output columns [col, col + cols)
    bool out_in;
  };
  const Backend* k_ = nullptr;
  std::vector<Piece> pieces_;
  int64_t in_ = 0, out_ = 0;
};

// LayerNorm or RMSNorm over rows of width C. mean is unused by RMSNorm.
class Norm {
 public:
  Norm() = default;
  Norm(const Backend& k, const ModelConfig& cfg, const ParamLayout& layout, Slot slot, int layer,
       float* params, float* grads);
  void forward(float* out, float* mean, float* rstd, const float* x, int64_t rows) const;
  // dx and the parameter gradients accumulate.
  void backward(float* dx, const float* dout, const float* x, const float* mean, const float* rstd,
                int64_t rows) const;
  bool rms() const { return kind_ == NormKind::RMSNorm; }
  // Gradients of the (replicated) norm parameters, for sequence-parallel reduction.
  float* dweight() const { return dw_; }
  float* dbias() const { return db_; }

 private:
  const Backend* k_ = nullptr;
  NormKind kind_ = NormKind::LayerNorm;
  float eps_ = 1e-5f;
  int64_t C_ = 0;
  const float *w_ = nullptr, *b_ = nullptr;
  float *dw_ = nullptr, *db_ = nullptr;
};

}  // namespace trellis
