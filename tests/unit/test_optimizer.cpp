// Optimizers: the fused clip factor equals scaling the gradients first, bit for bit; weight decay
// touches 2-D weights only; a ZeRO shard updates exactly its range; the LR schedule's shape.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"
#include "trellis/model/params.h"
#include "trellis/optim/optimizer.h"
#include "trellis/train/time_budget.h"

namespace trellis {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 40;
  return c;
}

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Optimizer, FusedGradMulEqualsScalingFirst) {
  const ParamLayout layout(tiny());
  for (const char* name : {"adamw", "sgd"}) {
    OptimConfig cfg;
    cfg.name = name;
    Optimizer fused(cfg, layout, 0, layout.size()), plain(cfg, layout, 0, layout.size());
    std::vector<float> p1 = random_vec(layout.size(), 1), p2 = p1;
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = random_vec(layout.size(), 10 + t);
      std::vector<float> scaled = g;
      ops::scale(scaled.data(), 0.37f, int64_t(scaled.size()));
      fused.step(p1.data(), g.data(), 1e-3f, t, 0.37f);
      plain.step(p2.data(), scaled.data(), 1e-3f, t);
    }
    EXPECT_EQ(p1, p2) << name;
  }
}

TEST(Optimizer, DecayOnlyOnTwoDimensionalWeightsAndShardRange) {
  const ParamLayout layout(tiny());
  OptimConfig cfg;
  cfg.weight_decay = 0.5f;
  const std::vector<float> p0 = random_vec(layout.size(), 2);
  const std::vector<float> zero_grad(layout.size(), 0.0f);
  // A shard in the middle of the buffer: only its elements may change.
  const size_t begin = layout.size() / 3, end = 2 * layout.size() / 3;
  Optimizer opt(cfg, layout, begin, end);
  std::vector<float> p = p0;
  opt.step(p.data(), zero_grad.data(), 0.1f, 1);
  for (const auto& s : layout.specs())
    for (size_t i = s.offset; i < s.offset + s.numel(); ++i) {
      const bool in_shard = i >= begin && i < end;
      // With zero gradients AdamW's only effect is the decoupled decay p *= 1 - lr * wd.
      const float want = in_shard && s.decay ? p0[i] * (1.0f - 0.1f * 0.5f) : p0[i];
      ASSERT_EQ(p[i], want) << s.name << " element " << i - s.offset;
    }
}

TEST(Optimizer, WarmupThenCosine) {
  OptimConfig c;
  c.lr = 1.0f, c.min_lr = 0.1f, c.warmup_steps = 4;
  EXPECT_FLOAT_EQ(learning_rate(c, 1, 20), 0.25f);
  EXPECT_FLOAT_EQ(learning_rate(c, 4, 20), 1.0f);
  EXPECT_FLOAT_EQ(learning_rate(c, 12, 20), 0.55f);  // half-way through the decay
  EXPECT_FLOAT_EQ(learning_rate(c, 20, 20), 0.1f);
  for (int s = 5; s < 20; ++s) EXPECT_GT(learning_rate(c, s, 20), learning_rate(c, s + 1, 20));
}

TEST(Optimizer, LinearConstantAndInverseSqrtSchedules) {
  OptimConfig c;
  c.lr = 1.0f, c.min_lr = 0.1f, c.warmup_steps = 4;
  c.lr_schedule = "linear";
  EXPECT_FLOAT_EQ(learning_rate(c, 2, 20), 0.5f);
  EXPECT_FLOAT_EQ(learning_rate(c, 12, 20), 0.55f);  // half-way through the decay
  EXPECT_FLOAT_EQ(learning_rate(c, 16, 20), 0.325f);
  EXPECT_FLOAT_EQ(learning_rate(c, 20, 20), 0.1f);
  c.lr_schedule = "constant";
  EXPECT_FLOAT_EQ(learning_rate(c, 3, 20), 0.75f);
  for (int s : {4, 5, 20}) EXPECT_FLOAT_EQ(learning_rate(c, s, 20), 1.0f);
  // The Transformer paper's d^-0.5 * min(s^-0.5, s * w^-1.5), rescaled to peak at lr.
  c.lr_schedule = "inverse_sqrt";
  const auto paper = [](double s, double w) {
    return std::min(1 / std::sqrt(s), s / (w * std::sqrt(w)));
  };
  for (int s : {1, 2, 4, 9, 16, 100})
    EXPECT_FLOAT_EQ(learning_rate(c, s, 200), float(paper(s, 4) / paper(4, 4))) << "step " << s;
  c.lr_schedule = "cosine-ish";
  EXPECT_THROW(learning_rate(c, 1, 20), Error);
}

TEST(Optimizer, DefaultWarmupIsATenthOfTheRun) {
  OptimConfig c;
  EXPECT_EQ(c.warmup_steps, -1);
  EXPECT_EQ(warmup_steps_for(c, 200), 20);
  EXPECT_EQ(warmup_steps_for(c, 5), 1);
  EXPECT_EQ(warmup_steps_for(c, 1000000), 2000);
  c.lr = 1.0f;
  EXPECT_FLOAT_EQ(learning_rate(c, 10, 200), 0.5f);
  c.warmup_steps = 0;  // no warmup: the first step already runs at the full rate
  c.lr_schedule = "constant";
  EXPECT_FLOAT_EQ(learning_rate(c, 1, 200), 1.0f);
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// time_budget's arithmetic: each step costs its time plus its share of the periodic evaluations,
// and the final evaluation is kept back; the result lies in [done, max_steps].
TEST(TimeBudget, LastStepThatFits) {
  BudgetClock c;
  c.budget_s = 100.0, c.elapsed_s = 10.0, c.step_s = 1.0;
  EXPECT_EQ(budget_last_step(c, 20, 1000), 110);  // 90 s left: 90 more steps
  EXPECT_EQ(budget_last_step(c, 20, 50), 50);      // all fit: the configured steps
  c.val_s = 10.0, c.val_every = 10;                // 2 s a step, 10 s kept for the last evaluation
  EXPECT_EQ(budget_last_step(c, 20, 1000), 60);
  c.val_every = 0;                                 // only the last evaluation
  EXPECT_EQ(budget_last_step(c, 20, 1000), 100);
  c.elapsed_s = 95.0;                              // already over: end now
  EXPECT_EQ(budget_last_step(c, 20, 1000), 20);
  c.elapsed_s = 10.0, c.step_s = 0.0;              // an untimed step cannot be fitted
  EXPECT_EQ(budget_last_step(c, 20, 1000), 20);
  EXPECT_EQ(budget_last_step(c, 1000, 1000), 1000);
}

}  // namespace
}  // namespace trellis
