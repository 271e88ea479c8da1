// Pipeline: a stage keeps its outstanding sends moving while it computes. Over TCP a large
// message moves only inside the library's calls, so a stage that polled only between operations
// held a last stage's activation gradients until its whole backward phase had ended.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fake_communicator.h"
#include "trellis/comm/communicator.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/pipeline/pipeline.h"
#include "trellis/parallel/pipeline/schedule.h"
#include "trellis/tensor_parallel/operators.h"

namespace trellis {
namespace {

// One rank of a 2-stage pipeline whose receives complete at once and whose sends complete only
// when waited on; it logs, per send, how often it was polled before the next send started. Any
// other call (a collective) fails the test.
class PollLog final : public fake::FakeCommunicator {
 public:
  explicit PollLog(int rank) : FakeCommunicator(rank, 2) {}
  std::vector<int> polls;  // per send, in the order sent

  std::string backend() const override { return "poll-log"; }
  std::unique_ptr<Work> send_async(const float*, size_t, int, int) override {
    polls.push_back(0);
    return std::make_unique<Send>(*this, polls.size() - 1);
  }
  std::unique_ptr<Work> recv_async(float*, size_t, int, int) override {
    return std::make_unique<Received>();
  }

 private:
  class Send final : public Work {
   public:
    Send(PollLog& log, size_t id) : log_(log), id_(id) {}
    void wait() override {}
    bool test() override {
      // Polls after the next send started are not counted: only those during the next op.
      if (id_ + 1 == log_.polls.size()) ++log_.polls[id_];
      return false;
    }

   private:
    PollLog& log_;
    size_t id_;
  };
  class Received final : public Work {
   public:
    void wait() override {}
    bool test() override { return true; }
  };
};

// Logs each call as "<name> <event> <layer>" into a log shared by several hooks.
class Recorder final : public BlockHooks {
 public:
  Recorder(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(log) {}
  void before_forward(int l) override { add("before_forward", l); }
  void after_forward(int l) override { add("after_forward", l); }
  void before_backward(int l) override { add("before_backward", l); }
  void after_backward(int l) override { add("after_backward", l); }

 private:
  void add(const char* event, int l) {
    log_.push_back(name_ + " " + event + " " + std::to_string(l));
  }
  std::string name_;
  std::vector<std::string>& log_;
};

constexpr int64_t kB = 1, kT = 16;
constexpr int kMicro = 4;

ModelConfig four_blocks() {
  ModelConfig cfg = model_preset("tiny");
  cfg.n_layer = 4;  // two blocks per stage
  cfg.validate();
  return cfg;
}

// Runs GPipe on stage `rank` of 2 with `hooks` installed before the pipeline's own; returns the
// polls of each send.
std::vector<int> run_stage(int rank, const std::vector<BlockHooks*>& hooks = {}) {
  const ModelConfig cfg = four_blocks();
  StageSpec stage;
  stage.layers = rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  stage.embedding = rank == 0;
  stage.head = rank == 1;
  const ParamLayout layout(cfg, 1, 0, &stage);
  std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
  init_params(layout, 5, params.data());
  TensorParallel no_tp(nullptr, false);
  ModelChunk model(layout, params.data(), grads.data(), no_tp, &stage);
  for (BlockHooks* h : hooks) model.add_block_hooks(*h);
  PollLog comm(rank);
  Pipeline pipe(comm, {&model}, kB, kT);
  auto load = [&](int m, Context& ctx) {
    for (size_t i = 0; i < ctx.tokens.size(); ++i) {
      ctx.tokens[i] = int32_t((i * 7 + size_t(m)) % size_t(cfg.vocab_size));
      ctx.targets[i] = int32_t((i * 3 + size_t(m)) % size_t(cfg.vocab_size));
    }
    for (Tensor* t : {&ctx.input, &ctx.doutput})
      for (int64_t i = 0; i < t->numel(); ++i) t->f32()[i] = 0.01f * float(i % 13);
    return kB;
  };
  pipe.run(build_schedule(ScheduleKind::GPipe, 2, rank, kMicro, 1), load,
           1.0f / float(kMicro * kB * kT));
  return comm.polls;
}

// Stage 0 sends activations after its forwards, stage 1 gradients after its backwards; in GPipe
// each is followed by another op of the same kind but for the last. Returns the sends checked.
int expect_polled_during_next_op(const std::vector<int>& polls) {
  int checked = 0;
  EXPECT_EQ(polls.size(), size_t(kMicro));
  if (polls.size() != size_t(kMicro)) return 0;
  for (int k = 0; k + 1 < kMicro; ++k) {
    EXPECT_GE(polls[size_t(k)], 2) << "send " << k;  // once per block of the next op
    ++checked;
  }
  return checked;
}

TEST(PipelineProgress, SendsArePolledBetweenBlocksOfTheNextOperation) {
  int checked = 0;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("stage " + std::to_string(rank));
    checked += expect_polled_during_next_op(run_stage(rank));
  }
  EXPECT_EQ(checked, 2 * (kMicro - 1));
}

// Block hooks are a list: hooks installed before the pipeline (ZeRO's, in the trainer) run, in
// the order installed, and the pipeline still polls its sends between blocks.
TEST(PipelineProgress, OtherBlockHooksRunInOrderBesideThePolling) {
  int checked = 0;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("stage " + std::to_string(rank));
    std::vector<std::string> log;
    Recorder first("first", log), second("second", log);
    checked += expect_polled_during_next_op(run_stage(rank, {&first, &second}));
    // Two blocks per stage, forward and backward of every micro-batch; each forward also opens
    // with before_forward(-1).
    int forwards = 0, opened = 0;
    ASSERT_EQ(log.size() % 2, 0u);
    for (size_t i = 0; i < log.size(); i += 2) {
      const std::string event = log[i].substr(log[i].find(' '));
      EXPECT_EQ(log[i], "first" + event);
      EXPECT_EQ(log[i + 1], "second" + event);
      if (event == " before_forward -1")
        ++opened;
      else if (event.rfind(" before_forward", 0) == 0)
        ++forwards;
    }
    EXPECT_EQ(forwards, 2 * kMicro);
    EXPECT_EQ(opened, kMicro);
  }
  EXPECT_EQ(checked, 2 * (kMicro - 1));
}

}  // namespace
}  // namespace trellis
