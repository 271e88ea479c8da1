#include "trellis/model/modules.h"

#include "trellis/core/error.h"

namespace trellis {

int WeightCopies::add(const float* w, int64_t n) {
  TRELLIS_CHECK(bits_.empty(), "a weight registered after its copies were made");
  copies_.push_back({w, n, elements_, 0});
  elements_ += n;
  return int(copies_.size()) - 1;
}

const uint16_t* WeightCopies::get(const Backend& k, int h) {
  if (!enabled_) return nullptr;
  if (base16_) return base16_ + (copies_[size_t(h)].w - base32_);
  if (bits_.empty()) bits_.resize(size_t(elements_));
  Copy& c = copies_[size_t(h)];
  if (c.generation != generation_) {
    k.to_bf16(bits_.data() + c.offset, c.w, c.n);
    c.generation = generation_;
  }
  return bits_.data() + c.offset;
}

const uint16_t* WeightCopies::bits(const Backend& k, int h) {
  if (const uint16_t* b = get(k, h)) return b;
  const Copy& c = copies_[size_t(h)];
  return round_once(k, c.w, c.n);
}

void WeightCopies::use_working(const float* base32, const uint16_t* base16) {
  base32_ = base32;
  base16_ = base16;
  enabled_ = true;
  std::vector<uint16_t>().swap(bits_);
}

void WeightCopies::set_enabled(bool enabled) {
  enabled_ = enabled;
  if (!enabled) std::vector<uint16_t>().swap(bits_);
  changed();
}

const uint16_t* WeightCopies::round_once(const Backend& k, const float* x, int64_t n) {
  if (scratch_.size() < size_t(n)) scratch_.resize(size_t(n));
  k.to_bf16(scratch_.data(), x, n);
  return scratch_.data();
}

Linear::Linear(const Backend& k, const ParamLayout& layout, std::vector<Slot> slots, int layer,
               float* params, float* grads, WeightCopies* copies)
    : k_(&k), copies_(copies) {
  for (Slot slot : slots) {
    const ParamSpec* w = layout.find(slot, layer);
    if (!w) continue;
    const ParamSpec* b = layout.find(slot, layer, true);
    const bool out_in = w->layout == WeightLayout::OutIn;
    const int64_t in = out_in ? w->shape[1] : w->shape[0],
                  cols = out_in ? w->shape[0] : w->shape[1];
    TRELLIS_CHECK(in_ == 0 || in_ == in, "{}: input width {} differs from its layer's {}", w->name,
                  in, in_);
    in_ = in;
    const Piece piece{params + w->offset,
                      grads ? grads + w->offset : nullptr,
                      b ? params + b->offset : nullptr,
                      b && grads ? grads + b->offset : nullptr,
                      out_,
                      cols,
                      out_in};
    out_ += cols;
    // [out, in] pieces stored back to back (q, k, v; gate, up) are one [out, in] matrix: one GEMM
    // instead of several. Pieces with biases stay apart (each bias is its own tensor).
    Piece* last = pieces_.empty() ? nullptr : &pieces_.back();
    if (last && out_in && last->out_in && !last->b && !piece.b &&
        piece.w == last->w + last->cols * in &&
        (!grads || piece.dw == last->dw + last->cols * in)) {
      last->cols += cols;
      continue;
    }
    pieces_.push_back(piece);
  }
  if (copies_)
    for (Piece& p : pieces_) p.copy = copies_->add(p.w, p.cols * in_);
}

ops::GemmOperand Linear::weight(const Piece& p) const {
  const int64_t ld = p.out_in ? in_ : p.cols;
  if (const uint16_t* w = copies_ ? copies_->get(*k_, p.copy) : nullptr) return {nullptr, w, ld};
  return {p.w, nullptr, ld};
}

void Linear::forward(float* y, Rows x, int64_t rows, bool add_bias) const {
  for (const Piece& p : pieces_) {
    const bool bias = add_bias && p.b;
    if (bias) k_->fill_rows(y + p.col, out_, p.b, rows, p.cols);
    k_->gemm_operands(false, p.out_in, rows, p.cols, in_, 1.0f, x.operand(in_), weight(p),
                      bias ? 1.0f : 0.0f, y + p.col, out_);
  }
}

void Linear::backward(float* dx, const float* dy, Rows x, int64_t rows, bool bias_grad) const {
  // bf16: dy rounded once for both GEMMs (the bits each would round it to).
  const Rows dyr = copies_ ? Rows(copies_->round_once(*k_, dy, rows * out_)) : Rows(dy);
  if (dx) input_gemms(dx, dyr, rows);
  weight_gemms(dyr, dy, x, rows, bias_grad);
}

void Linear::backward_input(float* dx, const float* dy, int64_t rows) const {
  input_gemms(dx, dy, rows);
}

void Linear::backward_weights(const float* dy, Rows x, int64_t rows, bool bias_grad) const {
  weight_gemms(dy, dy, x, rows, bias_grad);
}

void Linear::input_gemms(float* dx, Rows dy, int64_t rows) const {
  float dx_beta = 0.0f;  // the first piece writes dx, the others add to it
  for (const Piece& p : pieces_) {
    const ops::GemmOperand dyp = {dy.f32 ? dy.f32 + p.col : nullptr,
                                  dy.bf16 ? dy.bf16 + p.col : nullptr, out_};
    k_->gemm_operands(false, !p.out_in, rows, in_, p.cols, 1.0f, dyp, weight(p), dx_beta, dx, in_);
    dx_beta = 1.0f;
  }
}

void Linear::weight_gemms(Rows dy, const float* dy32, Rows x, int64_t rows, bool bias_grad) const {
  for (const Piece& p : pieces_) {
    const ops::GemmOperand dyp = {dy.f32 ? dy.f32 + p.col : nullptr,
                                  dy.bf16 ? dy.bf16 + p.col : nullptr, out_};
    if (p.out_in)
      k_->gemm_operands(true, false, p.cols, in_, rows, 1.0f, dyp, x.operand(in_), 1.0f, p.dw,
                        in_);
    else
      k_->gemm_operands(true, false, in_, p.cols, rows, 1.0f, x.operand(in_), dyp, 1.0f, p.dw,
                        p.cols);
    if (bias_grad && p.db) k_->bias_backward(p.db, dy32 + p.col, rows, p.cols, out_);
  }
}

Norm::Norm(const Backend& k, const ModelConfig& cfg, const ParamLayout& layout, Slot slot,
           int layer, float* params, float* grads)
    : k_(&k), kind_(cfg.norm), eps_(cfg.norm_eps), C_(cfg.n_embd) {
  const ParamSpec* w = layout.find(slot, layer);
  TRELLIS_CHECK(w, "layout has no norm for block {}", layer);
  w_ = params + w->offset;
  dw_ = grads ? grads + w->offset : nullptr;
  if (const ParamSpec* b = layout.find(slot, layer, true)) {
    b_ = params + b->offset;
    db_ = grads ? grads + b->offset : nullptr;
  }
}

void Norm::forward(float* out, float* mean, float* rstd, const float* x, int64_t rows) const {
  if (rms())
    k_->rmsnorm_forward(out, rstd, x, w_, rows, C_, eps_);
  else
    k_->layernorm_forward(out, mean, rstd, x, w_, b_, rows, C_, eps_);
}

void Norm::backward(float* dx, const float* dout, const float* x, const float* mean,
                    const float* rstd, int64_t rows) const {
  if (rms())
    k_->rmsnorm_backward(dx, dw_, dout, x, w_, rstd, rows, C_);
  else
    k_->layernorm_backward(dx, dw_, db_, dout, x, w_, mean, rstd, rows, C_);
}

}  // namespace trellis
