// Per-phase breakdown of one training step (the op sequence of GPT::forward/backward and the
// trainer's update), timed op by op. Mirrors src/trellis/model/gpt.cpp and train/trainer.cpp;
// keep it in step when those change. It uses ops::zero for the gradients and the optimizer's
// fused clip factor, as proposed for the trainer.
//   step_profile <preset> <vocab> <B> <T> [steps=5] [threads=2]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "trellis/kernels/ops.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/optim/optimizer.h"

using namespace trellis;
using Clock = std::chrono::steady_clock;

namespace {
std::map<std::string, double> g_ms;
std::vector<std::string> g_order;
struct Timed {
  std::string name;
  Clock::time_point t0 = Clock::now();
  explicit Timed(std::string n) : name(std::move(n)) {}
  ~Timed() {
    if (!g_ms.count(name)) g_order.push_back(name);
    g_ms[name] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
};
#define T_(name, ...) \
  do {                \
    Timed _t(name);   \
    __VA_ARGS__;      \
  } while (0)
void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }
}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "baby";
  ModelConfig cfg;
  cfg.vocab_size = argc > 2 ? std::atoi(argv[2]) : 256;
  cfg = model_preset(preset, cfg);
  const int64_t B = argc > 3 ? std::atoll(argv[3]) : 8, T = argc > 4 ? std::atoll(argv[4]) : 256;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 5;
  omp_set_num_threads(argc > 6 ? std::atoi(argv[6]) : 2);
  const int64_t BT = B * T, C = cfg.n_embd, H = cfg.n_head, V = cfg.vocab_size,
                Vp = cfg.padded_vocab(), L = cfg.n_layer;
  ParamLayout layout(cfg);
  const int64_t n = int64_t(layout.size());
  std::vector<float> params(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
  init_params(layout, 1337, params.data());
  OptimConfig oc;
  Optimizer opt(oc, layout, 0, size_t(n));
  auto P = [&](const std::string& s) { return params.data() + layout.spec(s).offset; };
  auto G = [&](const std::string& s) { return grads.data() + layout.spec(s).offset; };
  std::vector<int32_t> tok(static_cast<size_t>(BT)), tgt(static_cast<size_t>(BT));
  for (int64_t i = 0; i < BT; ++i)
    tok[size_t(i)] = int32_t((i * 7919) % V), tgt[size_t(i)] = int32_t((i * 104729 + 3) % V);
  struct A {
    std::vector<float> ln1, m1, r1, qkv, probs, att, res_mid, ln2, m2, r2, fc, gelu, res_out;
  };
  std::vector<A> acts(static_cast<size_t>(L));
  for (auto& a : acts) {
    a.ln1.resize(BT * C), a.m1.resize(BT), a.r1.resize(BT), a.qkv.resize(BT * 3 * C);
    a.probs.resize(B * H * T * T), a.att.resize(BT * C), a.res_mid.resize(BT * C);
    a.ln2.resize(BT * C), a.m2.resize(BT), a.r2.resize(BT), a.fc.resize(BT * 4 * C);
    a.gelu.resize(BT * 4 * C), a.res_out.resize(BT * C);
  }
  std::vector<float> emb(BT * C), lnf(BT * C), lnfm(BT), lnfr(BT), logits(BT * Vp), losses(BT);
  std::vector<float> dres(BT * C), dln(BT * C), dqkv(BT * 3 * C), datt(BT * C), dfc(BT * 4 * C),
      dgelu(BT * 4 * C);
  std::vector<double> step_ms;
  for (int s = 1; s <= steps; ++s) {
    if (s == 2) g_ms.clear(), g_order.clear();  // first step is warm-up
    const auto t0 = Clock::now();
    T_("zero_grads", ops::zero(grads.data(), n));
    T_("embedding_fwd",
       ops::embedding_forward(emb.data(), tok.data(), P("wte.weight"), 0, Vp, BT, C);
       ops::position_forward(emb.data(), P("wpe.weight"), 0, BT, T, C));
    const float* x = emb.data();
    for (int l = 0; l < L; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      A& a = acts[size_t(l)];
      T_("layernorm_fwd", ops::layernorm_forward(a.ln1.data(), a.m1.data(), a.r1.data(), x,
                                                 P(h + "ln_1.weight"), P(h + "ln_1.bias"), BT, C));
      T_("linear_fwd", ops::linear_forward(a.qkv.data(), a.ln1.data(), P(h + "attn.c_attn.weight"),
                                           P(h + "attn.c_attn.bias"), BT, C, 3 * C));
      T_("attention_fwd",
         ops::attention_forward(a.att.data(), a.probs.data(), a.qkv.data(), B, T, C, H));
      T_("linear_fwd",
         ops::linear_forward(a.res_mid.data(), a.att.data(), P(h + "attn.c_proj.weight"),
                             P(h + "attn.c_proj.bias"), BT, C, C));
      T_("residual", ops::accumulate(a.res_mid.data(), x, BT * C));
      T_("layernorm_fwd",
         ops::layernorm_forward(a.ln2.data(), a.m2.data(), a.r2.data(), a.res_mid.data(),
                                P(h + "ln_2.weight"), P(h + "ln_2.bias"), BT, C));
      T_("linear_fwd", ops::linear_forward(a.fc.data(), a.ln2.data(), P(h + "mlp.c_fc.weight"),
                                           P(h + "mlp.c_fc.bias"), BT, C, 4 * C));
      T_("gelu_fwd", ops::gelu_forward(a.gelu.data(), a.fc.data(), BT * 4 * C));
      T_("linear_fwd",
         ops::linear_forward(a.res_out.data(), a.gelu.data(), P(h + "mlp.c_proj.weight"),
                             P(h + "mlp.c_proj.bias"), BT, 4 * C, C));
      T_("residual", ops::accumulate(a.res_out.data(), a.res_mid.data(), BT * C));
      x = a.res_out.data();
    }
    T_("layernorm_fwd", ops::layernorm_forward(lnf.data(), lnfm.data(), lnfr.data(), x,
                                               P("ln_f.weight"), P("ln_f.bias"), BT, C));
    T_("logits_gemm", ops::gemm(false, true, BT, Vp, C, 1.0f, lnf.data(), C, P("wte.weight"), C,
                                0.0f, logits.data(), Vp));
    double loss = 0;
    T_("cross_entropy", loss = ops::cross_entropy(logits.data(), losses.data(), tgt.data(), BT, V,
                                                  Vp, 0, 1.0f / float(BT)));
    // backward
    T_("zero_scratch", zero(dln));
    T_("logits_bwd_gemms", ops::gemm(false, false, BT, C, Vp, 1.0f, logits.data(), Vp,
                                     P("wte.weight"), C, 0.0f, dln.data(), C);
       ops::gemm(true, false, Vp, C, BT, 1.0f, logits.data(), Vp, lnf.data(), C, 1.0f,
                 G("wte.weight"), C));
    T_("zero_scratch", zero(dres));
    T_("layernorm_bwd",
       ops::layernorm_backward(dres.data(), G("ln_f.weight"), G("ln_f.bias"), dln.data(), x,
                               P("ln_f.weight"), lnfm.data(), lnfr.data(), BT, C));
    for (int l = int(L) - 1; l >= 0; --l) {
      const std::string h = "h." + std::to_string(l) + ".";
      A& a = acts[size_t(l)];
      const float* xin = l == 0 ? emb.data() : acts[size_t(l - 1)].res_out.data();
      T_("zero_scratch", zero(dgelu));
      T_("linear_bwd", ops::linear_backward(dgelu.data(), G(h + "mlp.c_proj.weight"),
                                            G(h + "mlp.c_proj.bias"), dres.data(), a.gelu.data(),
                                            P(h + "mlp.c_proj.weight"), BT, 4 * C, C));
      T_("zero_scratch", zero(dfc));
      T_("gelu_bwd", ops::gelu_backward(dfc.data(), a.fc.data(), dgelu.data(), BT * 4 * C));
      T_("zero_scratch", zero(dln));
      T_("linear_bwd",
         ops::linear_backward(dln.data(), G(h + "mlp.c_fc.weight"), G(h + "mlp.c_fc.bias"),
                              dfc.data(), a.ln2.data(), P(h + "mlp.c_fc.weight"), BT, C, 4 * C));
      T_("layernorm_bwd",
         ops::layernorm_backward(dres.data(), G(h + "ln_2.weight"), G(h + "ln_2.bias"), dln.data(),
                                 a.res_mid.data(), P(h + "ln_2.weight"), a.m2.data(), a.r2.data(),
                                 BT, C));
      T_("zero_scratch", zero(datt));
      T_("linear_bwd",
         ops::linear_backward(datt.data(), G(h + "attn.c_proj.weight"), G(h + "attn.c_proj.bias"),
                              dres.data(), a.att.data(), P(h + "attn.c_proj.weight"), BT, C, C));
      T_("zero_scratch", zero(dqkv));
      T_("attention_bwd", ops::attention_backward(dqkv.data(), datt.data(), a.qkv.data(),
                                                  a.probs.data(), B, T, C, H));
      T_("zero_scratch", zero(dln));
      T_("linear_bwd", ops::linear_backward(dln.data(), G(h + "attn.c_attn.weight"),
                                            G(h + "attn.c_attn.bias"), dqkv.data(), a.ln1.data(),
                                            P(h + "attn.c_attn.weight"), BT, C, 3 * C));
      T_("layernorm_bwd",
         ops::layernorm_backward(dres.data(), G(h + "ln_1.weight"), G(h + "ln_1.bias"), dln.data(),
                                 xin, P(h + "ln_1.weight"), a.m1.data(), a.r1.data(), BT, C));
    }
    T_("embedding_bwd",
       ops::embedding_backward(G("wte.weight"), dres.data(), tok.data(), 0, Vp, BT, C);
       ops::position_backward(G("wpe.weight"), dres.data(), 0, BT, T, C));
    double nsq = 0;
    T_("sum_squares", nsq = ops::sum_squares(grads.data(), n));
    const double norm = std::sqrt(nsq);
    // As proposed for trainer.cpp: the clip factor rides along the optimizer sweep.
    const float grad_mul = norm > 1.0 ? float(1.0 / (norm + 1e-6)) : 1.0f;
    T_("optimizer", opt.step(params.data(), grads.data(), 1e-4f, s, grad_mul));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s >= 2) step_ms.push_back(ms);
    std::printf("step %d loss %.6f norm %.6f %.1f ms\n", s, loss / double(BT), norm, ms);
  }
  std::sort(step_ms.begin(), step_ms.end());
  const double k = double(step_ms.size());
  double tot = 0;
  for (auto& [_, v] : g_ms) tot += v;
  std::printf("%-18s %9s %6s\n", "phase", "ms/step", "%");
  for (const auto& name : g_order)
    std::printf("%-18s %9.1f %5.1f%%\n", name.c_str(), g_ms[name] / k, 100.0 * g_ms[name] / tot);
  std::printf("%-18s %9.1f   (median step %.1f ms)\n", "total", tot / k,
              step_ms[step_ms.size() / 2]);
}
