// validate_run: a run's shape checked once, each rule with the message the user acts on, and the
// value the trainer, --dry-run and --layout auto then share.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "trellis/core/error.h"
#include "trellis/plan/planner.h"
#include "trellis/plan/run_shape.h"
#include "trellis/train/validate_run.h"

namespace trellis {
namespace {

// The default job's model (mini: 4 layers, 4 heads) on a byte vocabulary, 64 positions.
RunData mini_data(const TrainConfig& cfg) {
  RunData d;
  d.model = cfg.model_config(256);
  d.T = 64;
  return d;
}

TEST(ValidateRun, ResolvesTheLayoutAndSplitsTheBatch) {
  TrainConfig cfg;
  cfg.tp = 2;
  cfg.batch_size = 8;
  cfg.micro_batch_size = 2;
  cfg.sequence_parallel = true;
  cfg.zero = 1;
  const RunShape run = validate_run(cfg, 4, mini_data(cfg));
  EXPECT_EQ(run.dp, 2);  // dp 0: the rest of the world
  EXPECT_EQ(run.tp, 2);
  EXPECT_EQ(run.pp, 1);
  EXPECT_EQ(run.micro_batch, 2);
  EXPECT_EQ(run.accum, 2);  // 8 / dp 2 / 2
  EXPECT_EQ(run.seq_len, 64);
  EXPECT_EQ(run.zero, 1);
  EXPECT_TRUE(run.sequence_parallel);
  // Sequence parallelism needs tp > 1; on one tensor-parallel rank it is off.
  cfg.tp = 1;
  EXPECT_FALSE(validate_run(cfg, 2, mini_data(cfg)).sequence_parallel);
}

TEST(ValidateRun, RefusesEachRuleWithItsMessage) {
  struct Case {
    std::function<void(TrainConfig&)> set;
    int world;
    std::string message;
  };
  const Case cases[] = {
      {[](TrainConfig& c) { c.dp = 2; }, 1,
       "layout dp=2 x tp=1 x pp=1 = 2 does not match the world size 1"},
      {[](TrainConfig& c) { c.tp = 3; }, 4,
       "layout tp=3 x pp=1 = 3 does not divide the world size 4"},
      {[](TrainConfig& c) { c.batch_size = 3; }, 2,
       "batch_size 3 is not a positive multiple of dp=2"},
      {[](TrainConfig& c) { c.micro_batch_size = 5; }, 1,
       "micro_batch_size 5 does not divide the per-rank batch 32 (batch_size 32 / dp 1)"},
      {[](TrainConfig& c) { c.virtual_stages = 0; }, 1, "virtual_stages must be >= 1"},
      {[](TrainConfig& c) { c.virtual_stages = 2; }, 1,
       "virtual_stages=2 needs --schedule interleaved"},
      {[](TrainConfig& c) { c.zero = 4; }, 1, "zero must be 0, 1, 2 or 3 (got 4)"},
      {[](TrainConfig& c) { c.zero = 2, c.pp = 2; }, 2,
       "zero 2 with pipeline parallelism (pp 2) is not supported: use zero 1 with pp, or zero 2/3 "
       "with dp and tp"},
      {[](TrainConfig& c) { c.tp = 2, c.sequence_parallel = true; }, 2, ""},  // 64 % 2: fine
      {[](TrainConfig& c) { c.pp = 8; }, 8, "need at least as many layers"},
      {[](TrainConfig& c) { c.tp = 8; }, 8, "tp=8 does not divide the number of heads 4"},
      {[](TrainConfig& c) { c.schedule = "zigzag"; }, 1, "unknown schedule 'zigzag'"},
      {[](TrainConfig& c) { c.layer_split = "3,x"; }, 1, "layer_split: 'x' is not a positive"},
  };
  for (const Case& k : cases) {
    TrainConfig cfg;
    k.set(cfg);
    try {
      validate_run(cfg, k.world, mini_data(cfg));
      EXPECT_EQ(k.message, "") << "accepted; expected: " << k.message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
      EXPECT_FALSE(k.message.empty()) << e.what();
      EXPECT_NE(std::string(e.what()).find(k.message), std::string::npos) << e.what();
    }
  }
}

TEST(ValidateRun, SequenceParallelismNeedsSeqLenDivisibleByTp) {
  RunShape run;
  run.model = TrainConfig().model_config(256);
  run.tp = 2;
  run.sequence_parallel = true;
  run.seq_len = 63;
  EXPECT_THROW(check_run_shape(run), Error);
  run.seq_len = 64;
  EXPECT_NO_THROW(check_run_shape(run));
}

// Every layout the planner offers is one the trainer runs: the planner and validate_run ask the
// same check_run_shape.
TEST(ValidateRun, ThePlannersLayoutsPassTheSameCheck) {
  PlanRequest req;
  req.model = TrainConfig().model_config(256);
  req.world = 4;
  req.batch = 8;
  req.seq_len = 64;
  for (const Layout& l : enumerate_layouts(req.model, req.world, req.batch))
    EXPECT_NO_THROW(layout_memory(req, l)) << l.describe();
}

}  // namespace
}  // namespace trellis
