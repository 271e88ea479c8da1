#pragma once
// The generic kernel case of test_kernels.cpp, after ggml's test-backend-ops: an op is described
// once (its seeded inputs, the trellis call, a plain double-precision reference and, where it has
// one, its backward) and run_case() checks it on buffers with guard regions:
//   * every input, output, gradient and dout buffer has kGuard canary elements before and after
//     it; a canary that changed is a write out of bounds (an overrun, or a negative offset);
//   * inputs (and, during backward, dout and the forward's outputs) must come back bit for bit:
//     a kernel that writes into an input fails;
//   * outputs start as NaN, so every element must be written, and are compared with the
//     reference normwise (kFwdTol), or exactly where the op is a single rounding;
//   * gradient mode: L = sum(out[0] * R); the kernel's backward gets dout = R and its float
//     gradients are compared with central differences of the *double* reference L (kGradTol).
//     Gradient buffers start from a random pattern P and the check uses (grad - P): the backward
//     must accumulate (+=) unless the op documents that it overwrites.
//   * speed mode: TRELLIS_KERNEL_SPEED=1 also prints the best of 5 timed calls (no assertion).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace kernel_case {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

// Float forward vs double reference, normwise. The a-priori error of a float sum of K terms is
// <= K * u * sum|terms| (u = 6e-8); with K <= 130 and O(1) random data that is on the order of
// 1e-5 of the output scale, while the measured errors (random rounding signs) are <= 3.5e-7 for
// every op. A real bug (wrong index, missing term, wrong scale) gives O(1e-2..1).
constexpr double kFwdTol = 1e-5;

// Analytic (float) vs numeric (double) gradients, normwise. The numeric side is accurate to
// ~1e-10 relative: central differences with h = 1e-5 of a double function have truncation error
// ~h^2 |f'''| / 6 and roundoff ~1e-16 |L| / h, both ~1e-10. So the float analytic gradient sets
// the error: the same K * u argument as for the forward (backward sums have at most ~130 terms;
// the LayerNorm/softmax backward subtractions are of O(1) terms, no catastrophic cancellation
// at these inputs). Measured: <= 4.1e-7 across all ops, so 1e-5 (~25x head-room) is justified;
// the common 1e-4 would be looser than float needs here.
constexpr double kGradTol = 1e-5;
constexpr double kFdStep = 1e-5;

// Element count (a named function, unlike size_t(n), never parses as a declaration).
inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

inline Vec randn(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline DVec to_d(const Vec& v) { return DVec(v.begin(), v.end()); }

// max|a - b| / max|b|: normwise relative error of a against reference b; infinite when a holds
// a NaN/inf (std::max alone would silently skip NaNs).
inline double rel_err(const DVec& a, const DVec& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0.0 ? num / den : num;
}
inline double rel_err(const Vec& a, const DVec& b) { return rel_err(to_d(a), b); }

inline double dot(const DVec& a, const DVec& r) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * r[i];
  return s;
}

// Central differences of the double-precision scalar function f around x.
inline DVec numeric_grad(const std::function<double(const DVec&)>& f, DVec x) {
  DVec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + kFdStep;
    const double fp = f(x);
    x[i] = xi - kFdStep;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2.0 * kFdStep);
  }
  return g;
}

// grad came out of a backward that started from `prefill`; what it added must match the numeric
// gradient of loss_of at x. The subtraction is done in double (exact for two floats).
inline void expect_grad(const std::string& what, const Vec& x, const Vec& grad,
                        const Vec& prefill, const std::function<double(const DVec&)>& loss_of) {
  ASSERT_EQ(grad.size(), x.size()) << what;
  ASSERT_EQ(prefill.size(), x.size()) << what;
  DVec added(x.size());
  for (size_t i = 0; i < x.size(); ++i) added[i] = double(grad[i]) - double(prefill[i]);
  const DVec num = numeric_grad(loss_of, to_d(x));
  double mx = 0.0;
  for (double v : num) mx = std::max(mx, std::abs(v));
  EXPECT_GT(mx, 1e-3) << what << ": degenerate test, numeric gradient is ~0";
  EXPECT_LE(rel_err(added, num), kGradTol) << what;
}

// n elements with kGuard canaries on each side; kernels get data().
template <class T>
class Guarded {
 public:
  static constexpr size_t kGuard = 16;  // a whole AVX-512 vector of floats past either end

  explicit Guarded(size_t n = 0, T fill = T{}) : n_(n), store_(n + 2 * kGuard, fill) {
    for (size_t i = 0; i < kGuard; ++i) store_[i] = store_[kGuard + n + i] = canary(i);
  }
  explicit Guarded(const std::vector<T>& v) : Guarded(v.size()) {
    std::copy(v.begin(), v.end(), data());
  }

  T* data() { return store_.data() + kGuard; }
  const T* data() const { return store_.data() + kGuard; }
  size_t size() const { return n_; }
  std::vector<T> values() const { return std::vector<T>(data(), data() + n_); }

  // Whether both guard regions still hold their canaries (compared bitwise); a failure names
  // the buffer and the side.
  bool intact(const std::string& what) const {
    bool ok = true;
    for (size_t side = 0; side < 2; ++side) {
      const T* g = store_.data() + (side ? kGuard + n_ : 0);
      for (size_t i = 0; i < kGuard; ++i) {
        const T want = canary(i);
        if (std::memcmp(&g[i], &want, sizeof(T)) != 0) {
          ADD_FAILURE() << what << ": written " << (side ? "past its end" : "before its start")
                        << " (guard element " << i << ")";
          ok = false;
          break;
        }
      }
    }
    return ok;
  }

 private:
  static T canary(size_t i) {
    if constexpr (std::is_floating_point_v<T>) return T(-1234.5) - T(i);  // no kernel computes it
    else return T(0x5eed0000 + int64_t(i));
  }
  size_t n_;
  std::vector<T> store_;
};

using GuardedF = Guarded<float>;
using GuardedI = Guarded<int32_t>;
using Ptrs = std::vector<float*>;
using CPtrs = std::vector<const float*>;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Input {
  std::string name;
  Vec values;
  bool differentiable = true;
};

struct Output {
  std::string name;
  size_t size;
  bool exact = false;  // a single rounding per element: compared for equality with float(ref)
};

// One op as run_case sees it. Integer side inputs (tokens, targets, masks) live in `ints`, which
// the calls capture; they are guarded and must come back unchanged too.
struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  std::vector<Output> outputs;  // outputs[0] is the one the gradient mode differentiates
  std::vector<std::shared_ptr<GuardedI>> ints;
  std::function<void(const CPtrs& in, const Ptrs& out)> forward;
  std::function<std::vector<DVec>(const std::vector<DVec>& in)> reference;
  // Empty: no gradient mode. grads[i] is null for an input that is not differentiable; out
  // holds what forward saved (mean, rstd, probs) and must not change.
  std::function<void(const float* dout, const CPtrs& in, const CPtrs& out, const Ptrs& grads)>
      backward;
  bool accumulates = true;  // false: the backward overwrites its gradients (documented in ops.h)
  Vec dout;                 // empty: a random one
};

struct CaseResult {
  std::vector<Vec> inputs, outputs, grads, prefill;
  Vec dout;
};

inline bool speed_mode() {
  const char* v = std::getenv("TRELLIS_KERNEL_SPEED");
  return v && *v && std::strcmp(v, "0") != 0;
}

// Best of 5 wall-clock times of f, in microseconds: printed only, never asserted.
inline double best_us(const std::function<void()>& f) {
  double best = INFINITY;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::micro>(
                              std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

inline CaseResult run_case(const OpCase& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  CaseResult res;
  std::vector<GuardedF> in, out;
  for (const Input& x : c.inputs) in.emplace_back(x.values);
  for (const Output& o : c.outputs) out.emplace_back(o.size, std::numeric_limits<float>::quiet_NaN());
  std::vector<std::vector<int32_t>> ints0;
  for (const auto& b : c.ints) ints0.push_back(b->values());
  auto cptrs = [](const std::vector<GuardedF>& v) {
    CPtrs p;
    for (const auto& b : v) p.push_back(b.data());
    return p;
  };
  auto ptrs = [](std::vector<GuardedF>& v) {
    Ptrs p;
    for (auto& b : v) p.push_back(b.data());
    return p;
  };
  // Guards of everything, and the buffers a call must not write, bit for bit.
  auto expect_untouched = [&](const char* phase, bool outputs_too) {
    for (size_t i = 0; i < in.size(); ++i) {
      in[i].intact(std::string(phase) + ": input " + c.inputs[i].name);
      EXPECT_TRUE(same_bits(in[i].values(), c.inputs[i].values))
          << phase << " wrote into input " << c.inputs[i].name;
    }
    for (size_t i = 0; i < c.ints.size(); ++i) {
      c.ints[i]->intact(std::string(phase) + ": integer input " + std::to_string(i));
      EXPECT_TRUE(same_bits(c.ints[i]->values(), ints0[i]))
          << phase << " wrote into integer input " << i;
    }
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].intact(std::string(phase) + ": output " + c.outputs[i].name);
      if (outputs_too)
        EXPECT_TRUE(same_bits(out[i].values(), res.outputs[i]))
            << phase << " changed output " << c.outputs[i].name;
    }
  };

  c.forward(cptrs(in), ptrs(out));
  expect_untouched("forward", false);
  for (const auto& o : out) res.outputs.push_back(o.values());
  for (const Input& x : c.inputs) res.inputs.push_back(x.values);
  std::vector<DVec> din;
  for (const Input& x : c.inputs) din.push_back(to_d(x.values));
  const std::vector<DVec> ref = c.reference(din);
  for (size_t k = 0; k < c.outputs.size(); ++k) {
    if (c.outputs[k].exact) {
      int64_t bad = 0;
      for (size_t i = 0; i < ref[k].size(); ++i)
        if (res.outputs[k][i] != float(ref[k][i]) && ++bad <= 3)
          EXPECT_EQ(res.outputs[k][i], float(ref[k][i])) << c.outputs[k].name << "[" << i << "]";
      EXPECT_EQ(bad, 0) << c.outputs[k].name << ": elements not equal to the reference";
    } else {
      EXPECT_LE(rel_err(res.outputs[k], ref[k]), kFwdTol) << c.outputs[k].name;
    }
  }
  if (speed_mode())
    std::printf("[speed] %s forward %.1f us\n", c.name.c_str(), best_us([&] {
                  c.forward(cptrs(in), ptrs(out));
                }));
  if (!c.backward) return res;

  std::mt19937 rng(seed);
  res.dout = c.dout.empty() ? randn(rng, c.outputs[0].size) : c.dout;
  GuardedF dout(res.dout);
  std::vector<GuardedF> grads;
  Ptrs gptrs;
  for (const Input& x : c.inputs) {
    res.prefill.push_back(x.differentiable && c.accumulates ? randn(rng, x.values.size())
                                                            : Vec(x.values.size(), 0.0f));
    grads.emplace_back(res.prefill.back());
  }
  for (size_t i = 0; i < grads.size(); ++i)
    gptrs.push_back(c.inputs[i].differentiable ? grads[i].data() : nullptr);
  c.backward(dout.data(), cptrs(in), cptrs(out), gptrs);
  expect_untouched("backward", true);
  dout.intact("backward: dout");
  EXPECT_TRUE(same_bits(dout.values(), res.dout)) << "backward wrote into dout";
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i].intact("backward: gradient of " + c.inputs[i].name);
    res.grads.push_back(grads[i].values());
    if (!c.inputs[i].differentiable) {
      EXPECT_TRUE(same_bits(res.grads[i], res.prefill[i])) << "d" << c.inputs[i].name;
      continue;
    }
    const DVec dR = to_d(res.dout);
    expect_grad("d" + c.inputs[i].name, c.inputs[i].values, res.grads[i], res.prefill[i],
                [&](const DVec& v) {
                  std::vector<DVec> moved = din;
                  moved[i] = v;
                  return dot(c.reference(moved)[0], dR);
                });
  }
  if (speed_mode()) {
    std::vector<GuardedF> scratch = grads;
    Ptrs sp;
    for (size_t i = 0; i < scratch.size(); ++i)
      sp.push_back(c.inputs[i].differentiable ? scratch[i].data() : nullptr);
    std::printf("[speed] %s backward %.1f us\n", c.name.c_str(), best_us([&] {
                  c.backward(dout.data(), cptrs(in), cptrs(out), sp);
                }));
  }
  return res;
}

}  // namespace kernel_case
