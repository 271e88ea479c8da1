// Where one training step of the real model goes: builds a ParamLayout and ModelChunk for a
// preset (any family), runs K steps of zero-grad, forward, backward and the optimizer (global-norm
// clip + update, as the trainer does), and prints the time of each kernel grouped by op name, and
// of each phase, as medians over the steps after the first (warm-up).
// The per-op times come from the model's own kernel calls: before the model is built, a copy of
// the CPU backend table whose entries time the real ones is installed with set_backend.
//   step_profile [--model PRESET=baby] [--batch B=8] [--seq T=min(256, context)]
//                [--threads N=2] [--steps K=5] [--vocab V=256] [--precision fp32|bf16]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/backend.h"
#include "trellis/kernels/ops.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/model_chunk.h"
#include "trellis/optim/optimizer.h"
#include "trellis/tensor_parallel/operators.h"

using namespace trellis;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The phase an op call is counted in.
enum Phase { kForward, kBackward, kOther, kPhases };
Phase g_phase = kOther;

// One op's time in the current step.
struct OpStat {
  const char* name = "";
  double ms[kPhases] = {};
  int64_t calls = 0;
};
std::vector<OpStat*> g_ops;

// Timed<&Backend::op>::call has the op's signature and times the wrapped entry. Function pointers
// carry no state, so each op gets its own instantiation with static storage. Kernels are called
// from one thread at a time (the model runs no kernel inside a parallel region).
template <auto Field, class Fn = std::remove_cvref_t<decltype(std::declval<Backend&>().*Field)>>
struct Timed;
template <auto Field, class R, class... A>
struct Timed<Field, R (*)(A...)> {
  static inline R (*inner)(A...) = nullptr;
  static inline OpStat stat;
  static R call(A... a) {
    struct Stop {
      Clock::time_point t0 = Clock::now();
      ~Stop() {
        stat.ms[g_phase] += ms_since(t0);
        ++stat.calls;
      }
    } stop;
    return inner(std::forward<A>(a)...);
  }
};

template <auto Field>
void wrap(Backend& table, const char* name) {
  using W = Timed<Field>;
  W::inner = table.*Field;
  W::stat.name = name;
  g_ops.push_back(&W::stat);
  table.*Field = &W::call;
}

// A copy of `base` whose every op is timed.
Backend timed_table(const Backend& base) {
  Backend t = base;
#define TRELLIS_TIME(op) wrap<&Backend::op>(t, #op)
  TRELLIS_TIME(gemm), TRELLIS_TIME(gemm_operands), TRELLIS_TIME(to_bf16);
  TRELLIS_TIME(add_bias), TRELLIS_TIME(fill_rows);
  TRELLIS_TIME(bias_backward), TRELLIS_TIME(layernorm_forward), TRELLIS_TIME(layernorm_backward);
  TRELLIS_TIME(rmsnorm_forward), TRELLIS_TIME(rmsnorm_backward), TRELLIS_TIME(gelu_forward);
  TRELLIS_TIME(gelu_backward), TRELLIS_TIME(gelu_bias_forward);
  TRELLIS_TIME(swiglu_forward), TRELLIS_TIME(swiglu_backward);
  TRELLIS_TIME(gelu_forward_bf16), TRELLIS_TIME(gelu_backward_bf16);
  TRELLIS_TIME(swiglu_forward_bf16), TRELLIS_TIME(swiglu_backward_bf16);
  TRELLIS_TIME(rope_forward), TRELLIS_TIME(rope_backward), TRELLIS_TIME(attention_forward);
  TRELLIS_TIME(attention_backward), TRELLIS_TIME(attention_cached);
  TRELLIS_TIME(attention_forward_bf16), TRELLIS_TIME(attention_backward_bf16);
  TRELLIS_TIME(embedding_forward);
  TRELLIS_TIME(embedding_backward), TRELLIS_TIME(position_forward);
  TRELLIS_TIME(position_backward), TRELLIS_TIME(cross_entropy), TRELLIS_TIME(dropout);
  TRELLIS_TIME(embedding_forward_bf16), TRELLIS_TIME(position_forward_bf16);
  TRELLIS_TIME(cross_entropy_bf16);
  TRELLIS_TIME(accumulate);
  TRELLIS_TIME(zero);
#undef TRELLIS_TIME
  // The device and one pointer per op: an op added to Backend must be added above too.
  static_assert(sizeof(Backend) == (1 + 37) * sizeof(void*), "time every op of Backend");
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Args {
  std::string model = "baby";
  bool bf16 = false;
  int64_t B = 8, T = 0;
  int threads = 2, steps = 5, vocab = 256;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "step_profile: %s\nusage: step_profile [--model PRESET=baby] [--batch B=8] "
               "[--seq T=min(256, context)] [--threads N=2] [--steps K=5] [--vocab V=256] "
               "[--precision fp32|bf16]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "-h" || key == "--help") usage("per-op and per-phase time of a training step");
    if (i + 1 >= argc) usage(("missing value for " + key).c_str());
    const char* v = argv[++i];
    if (key == "--model") {
      a.model = v;
      continue;
    }
    if (key == "--precision") {
      if (std::string(v) != "fp32" && std::string(v) != "bf16") usage("--precision: fp32 or bf16");
      a.bf16 = std::string(v) == "bf16";
      continue;
    }
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < 1) usage((key + " needs a positive integer").c_str());
    if (key == "--batch") {
      a.B = n;
    } else if (key == "--seq") {
      a.T = n;
    } else if (key == "--threads") {
      a.threads = int(n);
    } else if (key == "--steps") {
      a.steps = int(n);
    } else if (key == "--vocab") {
      a.vocab = int(n);
    } else {
      usage(("unknown option " + key).c_str());
    }
  }
  return a;
}

int run(const Args& a) {
  ModelConfig base;
  base.vocab_size = a.vocab;
  const ModelConfig cfg = model_preset(a.model, base);
  const int64_t B = a.B, T = a.T > 0 ? a.T : std::min<int64_t>(256, cfg.block_size), BT = B * T;
  omp_set_num_threads(a.threads);

  // Install the timing table before the model takes backend(Device::CPU) in its constructor.
  const DType compute = a.bf16 ? DType::BF16 : DType::F32;
  static const Backend timed = timed_table(backend(Device::CPU, compute));
  set_backend(Device::CPU, &timed, compute);

  ParamLayout layout(cfg);
  const int64_t n = int64_t(layout.size());
  std::vector<float> params(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
  init_params(layout, 1337, params.data());
  TensorParallel tp(nullptr, false);
  ModelChunk model(layout, params.data(), grads.data(), tp, nullptr, compute);
  OptimConfig oc;
  Optimizer opt(oc, layout, 0, size_t(n));
  Context ctx;
  model.prepare(ctx, B, T);
  for (int64_t i = 0; i < BT; ++i) {
    ctx.tokens[size_t(i)] = int32_t((i * 7919) % cfg.vocab_size);
    ctx.targets[size_t(i)] = int32_t((i * 104729 + 3) % cfg.vocab_size);
  }

  std::printf(
      "step_profile: %s (%s) | %d+%d layers, width %d, %d heads (%d kv), ffn %d | %.2fM "
      "parameters, vocab %d (%d padded) | batch %lld x %lld | %d threads | %d steps\n",
      a.model.c_str(), cfg.arch.c_str(), cfg.n_layer, cfg.n_dec_layer, cfg.n_embd, cfg.n_head,
      cfg.kv_heads(), cfg.ffn(), double(layout.count()) / 1e6, cfg.vocab_size, cfg.padded_vocab(),
      static_cast<long long>(B), static_cast<long long>(T), a.threads, a.steps);

  // Per step: each op's time by phase and calls; the phases' wall times.
  enum { kZeroGrad, kFwd, kBwd, kNorm, kOptim, kStep, kWall };
  struct StepRecord {
    std::vector<OpStat> ops;
    double wall[kWall] = {};
    double op_ms[kPhases] = {};  // all ops of a phase
  };
  std::vector<StepRecord> rec;
  const float grad_scale = 1.0f / float(BT);
  for (int s = 1; s <= a.steps; ++s) {
    for (OpStat* o : g_ops) *o = OpStat{o->name, {}, 0};
    StepRecord r;
    const auto t_step = Clock::now();
    auto t0 = Clock::now();
    ops::zero(grads.data(), n);  // as the trainer does, outside the model
    r.wall[kZeroGrad] = ms_since(t0);
    g_phase = kForward, t0 = Clock::now();
    const double loss = model.forward(ctx, grad_scale) / double(BT);
    r.wall[kFwd] = ms_since(t0);
    g_phase = kBackward, t0 = Clock::now();
    model.backward(ctx, true);
    r.wall[kBwd] = ms_since(t0);
    g_phase = kOther, t0 = Clock::now();
    const double norm = std::sqrt(ops::sum_squares(grads.data(), n));
    r.wall[kNorm] = ms_since(t0);
    t0 = Clock::now();
    const float clip = oc.grad_clip;
    const float grad_mul = clip > 0.0f && norm > clip ? float(clip / (norm + 1e-6)) : 1.0f;
    opt.step(params.data(), grads.data(), learning_rate(oc, s, a.steps), s, grad_mul);
    r.wall[kOptim] = ms_since(t0);
    r.wall[kStep] = ms_since(t_step);
    for (const OpStat* o : g_ops) {
      r.ops.push_back(*o);
      for (int ph = 0; ph < kPhases; ++ph) r.op_ms[ph] += o->ms[ph];
    }
    std::printf("step %d  loss %.6f  grad norm %.4f  %.1f ms\n", s, loss, norm, r.wall[kStep]);
    rec.push_back(std::move(r));
  }

  // Medians over steps 2..K (step 1 alone if K = 1).
  const size_t first = rec.size() > 1 ? 1 : 0;
  auto med = [&](auto get) {
    std::vector<double> v;
    for (size_t i = first; i < rec.size(); ++i) v.push_back(get(rec[i]));
    return median(std::move(v));
  };
  const double step_ms = med([](const StepRecord& r) { return r.wall[kStep]; });
  const double pct = 100.0 / step_ms;
  struct Row {
    const char* name;
    double calls, fwd, bwd, total;
  };
  std::vector<Row> rows;
  for (size_t k = 0; k < g_ops.size(); ++k) {
    auto op = [k](const StepRecord& r) -> const OpStat& { return r.ops[k]; };
    Row row{g_ops[k]->name, med([&](const StepRecord& r) { return double(op(r).calls); }),
            med([&](const StepRecord& r) { return op(r).ms[kForward]; }),
            med([&](const StepRecord& r) { return op(r).ms[kBackward]; }),
            med([&](const StepRecord& r) {
              return op(r).ms[kForward] + op(r).ms[kBackward] + op(r).ms[kOther];
            })};
    if (row.calls > 0) rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.total > y.total; });
  std::printf("\nmedians of steps %zu..%zu (ms per step)\n", first + 1, rec.size());
  std::printf("%-20s %7s %9s %9s %9s %7s\n", "op", "calls", "forward", "backward", "total",
              "% step");
  for (const Row& r : rows)
    std::printf("%-20s %7.0f %9.2f %9.2f %9.2f %6.1f%%\n", r.name, r.calls, r.fwd, r.bwd, r.total,
                r.total * pct);
  const double fwd_ops = med([](const StepRecord& r) { return r.op_ms[kForward]; });
  const double bwd_ops = med([](const StepRecord& r) { return r.op_ms[kBackward]; });
  const double all_ops = med(
      [](const StepRecord& r) { return r.op_ms[kForward] + r.op_ms[kBackward] + r.op_ms[kOther]; });
  std::printf("%-20s %7s %9.2f %9.2f %9.2f %6.1f%%\n", "(all ops)", "", fwd_ops, bwd_ops, all_ops,
              all_ops * pct);

  // Phases; "outside ops" is the model's own time between kernel calls.
  std::printf("\n%-36s %9s %7s %12s\n", "phase", "ms", "% step", "outside ops");
  auto phase = [&](const char* name, auto get, int ops_phase = -1) {
    const double ms = med(get);
    std::printf("%-36s %9.2f %6.1f%%", name, ms, ms * pct);
    if (ops_phase >= 0)
      std::printf(" %12.2f", med([&](const StepRecord& r) { return get(r) - r.op_ms[ops_phase]; }));
    std::printf("\n");
  };
  phase("zero_grad", [](const StepRecord& r) { return r.wall[kZeroGrad]; });
  phase(
      "forward", [](const StepRecord& r) { return r.wall[kFwd]; }, kForward);
  phase(
      "backward", [](const StepRecord& r) { return r.wall[kBwd]; }, kBackward);
  phase("optimizer (grad norm + clip + update)",
        [](const StepRecord& r) { return r.wall[kNorm] + r.wall[kOptim]; });
  phase("  of which grad norm", [](const StepRecord& r) { return r.wall[kNorm]; });
  std::printf("%-36s %9.2f  (%.0f tokens/s)\n", "step", step_ms, double(BT) * 1000.0 / step_ms);
  set_backend(Device::CPU, nullptr, compute);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_profile: error: %s\n", e.what());
    return 2;
  }
}
