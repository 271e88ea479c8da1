#pragma once
// The building blocks a Transformer is composed of, as views of this rank's parameters and
// gradients with explicit forward/backward through the kernel backend. No communication here.
#include <cstdint>
#include <vector>

#include "trellis/kernels/backend.h"
#include "trellis/model/params.h"

namespace trellis {

// The bf16 copies of the weights a bf16 model multiplies (the linear layers' and the head's; with
// bf16_embeddings also the tables it looks up): each rounded once and read by every GEMM (and
// lookup) until the fp32 master weights change, instead of rounded again by each GEMM call
// (every micro-batch's forward, backward and recompute). The same bits either way: a bf16 GEMM
// rounds its fp32 operands exactly so. Not thread-safe: one forward or backward of a model runs
// at a time.
class WeightCopies {
 public:
  // Registers the weight w[0, n) (before the first get) and returns its handle.
  int add(const float* w, int64_t n);
  // The bf16 bits of weight h, rounded again if the weights changed since they were; null while
  // disabled (the caller passes the fp32 weight, and the GEMM rounds it).
  const uint16_t* get(const Backend& k, int h);
  // get, or while disabled weight h rounded into round_once's scratch: a lookup table's bits
  // (a lookup, unlike a GEMM, cannot round what it reads).
  const uint16_t* bits(const Backend& k, int h);
  // The fp32 master weights may have changed (an optimizer step, a load, a ZeRO gather).
  void changed() { ++generation_; }
  // Disabled: no copies are held (ZeRO-3, whose rank holds a block's weights only while it
  // runs); frees them.
  void set_enabled(bool enabled);
  bool enabled() const { return enabled_; }
  // The bits come from outside, laid out as the fp32 buffer base32 that the registered weights
  // point into: a mixed-precision run's bf16 working weights, which its data-parallel sync keeps
  // current (parallel/working_weights.h). get then returns base16 + (w - base32) and rounds
  // nothing; no copies are held here.
  void use_working(const float* base32, const uint16_t* base16);
  bool working() const { return base16_ != nullptr; }
  int64_t elements() const { return elements_; }
  // x[0, n) rounded to bf16 in scratch that the next call reuses (a layer's output gradient,
  // read by both its backward GEMMs).
  const uint16_t* round_once(const Backend& k, const float* x, int64_t n);

 private:
  struct Copy {
    const float* w;
    int64_t n, offset;
    uint64_t generation;  // of the fp32 values it was rounded from (0: never)
  };
  std::vector<Copy> copies_;
  std::vector<uint16_t> bits_, scratch_;
  int64_t elements_ = 0;
  const float* base32_ = nullptr;
  const uint16_t* base16_ = nullptr;
  uint64_t generation_ = 1;
  bool enabled_ = true;
};

// A linear layer's input rows: fp32, or bf16 bits already rounded (a bf16 model's saved input).
struct Rows {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  Rows(const float* x) : f32(x) {}      // NOLINT: implicit, as the fp32 pointer it stands for
  Rows(const uint16_t* x) : bf16(x) {}  // NOLINT
  ops::GemmOperand operand(int64_t ld) const { return {f32, bf16, ld}; }
};

// A linear layer y[rows, out] = x[rows, in] W (+ b). Its weight is one tensor or several pieces
// that write consecutive column ranges of y (q|k|v, gate|up), each stored [in, out] or [out, in].
class Linear {
 public:
  Linear() = default;
  // The pieces are the tensors of `slots` in block `layer`, in order. copies: a bf16 model's
  // weight copies (null: fp32), which the layer registers its weights with; in bf16 a layer also
  // rounds its output gradient once for both backward GEMMs.
  Linear(const Backend& k, const ParamLayout& layout, std::vector<Slot> slots, int layer,
         float* params, float* grads, WeightCopies* copies = nullptr);
  bool empty() const { return pieces_.empty(); }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // Adds the bias only when add_bias (a row-parallel layer adds it after summing its partials).
  void forward(float* y, Rows x, int64_t rows, bool add_bias = true) const;
  // dx (may be null) is written (not accumulated: no zero-fill needed before); the parameter
  // gradients accumulate.
  void backward(float* dx, const float* dy, Rows x, int64_t rows, bool bias_grad = true) const;
  // backward's two independent halves (a split backward runs them apart): dx, then the weight
  // (and bias) gradients.
  void backward_input(float* dx, const float* dy, int64_t rows) const;
  void backward_weights(const float* dy, Rows x, int64_t rows, bool bias_grad = true) const;
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
    int copy = -1;  // its handle in copies_
  };
  // The weight of p as a GEMM operand: its bf16 copy, or the fp32 values.
  ops::GemmOperand weight(const Piece& p) const;
  // The GEMMs of backward_input and backward_weights, dy in either precision; dy32 (fp32) feeds
  // the bias gradient.
  void input_gemms(float* dx, Rows dy, int64_t rows) const;
  void weight_gemms(Rows dy, const float* dy32, Rows x, int64_t rows, bool bias_grad) const;
  const Backend* k_ = nullptr;
  WeightCopies* copies_ = nullptr;
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
