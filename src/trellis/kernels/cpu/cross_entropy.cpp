// Softmax + cross-entropy over the true vocabulary, optionally with the vocabulary split across
// ranks (Megatron's vocab-parallel cross-entropy: row max, sum of exps and target logit are
// combined, the full logits never are), optionally label-smoothed (then the row's sum of logits
// over the true vocabulary joins the same sum-combine). Padding columns get zero gradient.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/cpu/bf16_lanes.h"
#include "trellis/kernels/cpu/simd_math.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {

float row_max(const float* row, int64_t n) {
  using f8 = float __attribute__((vector_size(32)));
  float mx = -INFINITY;
  f8 m8 = {mx, mx, mx, mx, mx, mx, mx, mx};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    f8 v;
    std::memcpy(&v, row + j, sizeof v);
    m8 = v > m8 ? v : m8;
  }
  for (int k = 0; k < 8; ++k) mx = std::max(mx, m8[k]);
  for (; j < n; ++j) mx = std::max(mx, row[j]);
  return mx;
}

// Sum of exp(row[j] - mx) in double; 4 lanes at a time (libm's scalar exp dominated this loop),
// combined in a fixed order so the sum is reproducible.
double row_sum_exp(const float* row, int64_t n, double mx) {
  const simd::d4 mx4 = simd::splat(mx);
  simd::d4 acc[2] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    acc[0] += simd::exp(simd::load4(row + j) - mx4);
    acc[1] += simd::exp(simd::load4(row + j + 4) - mx4);
  }
  const int64_t vec_end = n / 4 * 4;
  for (; j < vec_end; j += 4) acc[0] += simd::exp(simd::load4(row + j) - mx4);
  const simd::d4 s4 = acc[0] + acc[1];
  double sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
  for (; j < n; ++j) sum += std::exp(double(row[j]) - mx);
  return sum;
}

// Sum of row[0, n) in double, 4 lanes at a time, combined in a fixed order.
double row_sum(const float* row, int64_t n) {
  simd::d4 acc[2] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    acc[0] += simd::load4(row + j);
    acc[1] += simd::load4(row + j + 4);
  }
  const int64_t vec_end = n / 4 * 4;
  for (; j < vec_end; j += 4) acc[0] += simd::load4(row + j);
  const simd::d4 s4 = acc[0] + acc[1];
  double sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
  for (; j < n; ++j) sum += double(row[j]);
  return sum;
}

// A row of logits as fp32 values: an fp32 row is used in place; a bf16 row is widened (exactly)
// into this thread's buffer, and store() rounds the buffer back into it, once per element.
template <class T>
class Row;
template <>
class Row<float> {
 public:
  Row(float* row, int64_t) : row_(row) {}
  float* data() const { return row_; }
  void store() const {}

 private:
  float* row_;
};
template <>
class Row<uint16_t> {
 public:
  Row(uint16_t* row, int64_t n) : row_(row), n_(n) {
    thread_local std::vector<float> buffer;
    if (buffer.size() < size_t(n)) buffer.resize(size_t(n));
    buf_ = buffer.data();
    for (int64_t j = 0; j < n; ++j) buf_[j] = simd::widen_bf16(row[j]);
  }
  float* data() const { return buf_; }
  void store() const {
    for (int64_t j = 0; j < n_; ++j) row_[j] = simd::round_bf16(buf_[j]);
  }

 private:
  uint16_t* row_;
  float* buf_;
  int64_t n_;
};

// One body for both storages: Row<float> is the row itself, Row<uint16_t> its widened copy in
// a thread's buffer, written back rounded once (nearest even) where the gradient replaces it.
template <class T>
double cross_entropy_impl(T* logits, float* losses, const int32_t* targets, int64_t BT,
                          int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                          const RowCombine& combine, float label_smoothing, int64_t vocab_size) {
  TRELLIS_CHECK(valid >= 0 && valid <= ld, "cross_entropy: {} valid of {} columns", valid, ld);
  TRELLIS_CHECK(label_smoothing >= 0.0f && label_smoothing < 1.0f,
                "cross_entropy: label smoothing {} is outside [0, 1)", label_smoothing);
  if (vocab_size == 0) vocab_size = valid;
  TRELLIS_CHECK(vocab_size >= valid && (vocab_size > 0 || label_smoothing == 0.0f),
                "cross_entropy: vocabulary of {} with {} valid columns here", vocab_size, valid);
  const bool smooth = label_smoothing > 0.0f;
  // stats: [0,BT) row max, [BT,2BT) sum of exp(x - max), [2BT,3BT) target logit (0 if not ours),
  // and when smoothing [3BT,4BT) the sum of the row's logits over the true vocabulary. The last
  // two or three are summed across ranks in one combine.
  std::vector<double> stats(size_t((smooth ? 4 : 3) * BT), 0.0);
  double* mx = stats.data();
  double* sum = mx + BT;
  double* target_logit = sum + BT;
  double* logit_sum = smooth ? target_logit + BT : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) mx[i] = row_max(Row<T>(logits + i * ld, valid).data(), valid);
  if (combine) combine(mx, BT, true);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    const Row<T> widened(logits + i * ld, valid);
    const float* row = widened.data();
    sum[i] = row_sum_exp(row, valid, double(float(mx[i])));
    const int64_t t = int64_t(targets[i]) - vocab_start;
    target_logit[i] = t >= 0 && t < valid ? double(row[t]) : 0.0;
    if (smooth) logit_sum[i] = row_sum(row, valid);
  }
  if (combine) combine(sum, (smooth ? 3 : 2) * BT, false);
  // Smoothed (PyTorch's CrossEntropyLoss(label_smoothing = e) over V classes): the target gets
  // 1 - e + e/V, every class e/V, so loss = lse - (1 - e) x_t - (e/V) sum_c x_c and
  // dlogits = grad_scale * (softmax - (1 - e) onehot - e/V).
  const double eps = double(label_smoothing);
  const double per_class = smooth ? eps / double(vocab_size) : 0.0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    if (targets[i] < 0) {  // padding: no loss, no gradient
      losses[i] = 0.0f;
      if (grad_scale != 0.0f) std::fill_n(logits + i * ld, ld, T(0));
      continue;
    }
    const double lse = mx[i] + std::log(sum[i]);
    losses[i] = smooth ? float(lse - (1.0 - eps) * target_logit[i] - per_class * logit_sum[i])
                       : float(lse - target_logit[i]);
    if (grad_scale == 0.0f) continue;
    Row<T> widened(logits + i * ld, valid);
    float* row = widened.data();
    // dlogits = grad_scale * softmax (- grad_scale * e/V), evaluated in double and rounded once.
    const double m = double(float(mx[i])), k = double(grad_scale) / sum[i];
    const double off = double(grad_scale) * per_class;
    const simd::d4 mx4 = simd::splat(m), k4 = simd::splat(k), off4 = simd::splat(off);
    const int64_t vec_end = valid / 4 * 4;
    int64_t j = 0;
    if (smooth) {
      for (; j < vec_end; j += 4)
        simd::store4(row + j, simd::exp(simd::load4(row + j) - mx4) * k4 - off4);
      for (; j < valid; ++j) row[j] = float(std::exp(double(row[j]) - m) * k - off);
    } else {
      for (; j < vec_end; j += 4)
        simd::store4(row + j, simd::exp(simd::load4(row + j) - mx4) * k4);
      for (; j < valid; ++j) row[j] = float(std::exp(double(row[j]) - m) * k);
    }
    const int64_t t = int64_t(targets[i]) - vocab_start;
    if (t >= 0 && t < valid)
      row[t] = smooth ? float(double(row[t]) - double(grad_scale) * (1.0 - eps))
                      : row[t] - grad_scale;
    widened.store();
    std::fill(logits + i * ld + valid, logits + (i + 1) * ld, T(0));
  }
  // Summed in row order after the parallel loops, so the total is reproducible.
  double total = 0.0;
  for (int64_t i = 0; i < BT; ++i) total += losses[i];
  return total;
}

}  // namespace

double cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t BT,
                     int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                     const RowCombine& combine, float label_smoothing, int64_t vocab_size) {
  return cross_entropy_impl(logits, losses, targets, BT, valid, ld, vocab_start, grad_scale,
                            combine, label_smoothing, vocab_size);
}

double cross_entropy_bf16(uint16_t* logits, float* losses, const int32_t* targets, int64_t BT,
                          int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                          const RowCombine& combine, float label_smoothing, int64_t vocab_size) {
  return cross_entropy_impl(logits, losses, targets, BT, valid, ld, vocab_start, grad_scale,
                            combine, label_smoothing, vocab_size);
}

}  // namespace trellis::ops
