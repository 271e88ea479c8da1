// Pipeline: a stage keeps its outstanding sends moving while it computes. Over TCP a large
// message moves only inside the library's calls, so a stage that polled only between operations
// held a last stage's activation gradients until its whole backward phase had ended.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/model/config.h"
#include "trellis/model/params.h"
#include "trellis/model/transformer.h"
#include "trellis/parallel/pipeline/pipeline.h"
#include "trellis/parallel/pipeline/schedule.h"
#include "trellis/tensor_parallel/operators.h"

namespace trellis {
namespace {

// One rank of a 2-stage pipeline whose receives complete at once and whose sends complete only
// when waited on; it logs, per send, how often it was polled before the next send started.
class PollLog final : public Communicator {
 public:
  explicit PollLog(int rank) : rank_(rank) {}
  std::vector<int> polls;  // per send, in the order sent

  int rank() const override { return rank_; }
  int size() const override { return 2; }
  int world_rank() const override { return rank_; }
  std::string backend() const override { return "poll-log"; }
  std::unique_ptr<Work> send_async(const float*, size_t, int, int) override {
    polls.push_back(0);
    return std::make_unique<Send>(*this, polls.size() - 1);
  }
  std::unique_ptr<Work> recv_async(float*, size_t, int, int) override {
    return std::make_unique<Received>();
  }
  std::unique_ptr<Work> all_reduce_async(float*, size_t) override { return unused(); }
  std::unique_ptr<Work> reduce_scatter_async(const float*, float*, size_t) override {
    return unused();
  }
  std::unique_ptr<Work> all_gather_async(const float*, float*, size_t) override {
    return unused();
  }
  std::unique_ptr<Work> broadcast_async(float*, size_t, int) override { return unused(); }
  void all_reduce_sum(double*, size_t) override { unused(); }
  void all_reduce_max(double*, size_t) override { unused(); }
  void barrier() override { unused(); }
  std::unique_ptr<Communicator> split(int, int) override {
    unused();
    return nullptr;
  }
  [[noreturn]] void abort(const std::string& msg, int) override { throw std::runtime_error(msg); }

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
  static std::unique_ptr<Work> unused() {
    throw std::logic_error("a pipeline stage made a collective call");
  }
  int rank_;
};

TEST(PipelineProgress, SendsArePolledBetweenBlocksOfTheNextOperation) {
  ModelConfig cfg = model_preset("tiny");
  cfg.n_layer = 4;  // two blocks per stage
  cfg.validate();
  const int64_t B = 1, T = 16;
  const int micro = 4;
  int checked = 0;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("stage " + std::to_string(rank));
    StageSpec stage;
    stage.layers = rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    stage.embedding = rank == 0;
    stage.head = rank == 1;
    const ParamLayout layout(cfg, 1, 0, &stage);
    std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
    init_params(layout, 5, params.data());
    TensorParallel no_tp(nullptr, false);
    Transformer model(layout, params.data(), grads.data(), no_tp, &stage);
    PollLog comm(rank);
    Pipeline pipe(comm, {&model}, B, T);
    auto load = [&](int m, Context& ctx) {
      for (size_t i = 0; i < ctx.tokens.size(); ++i) {
        ctx.tokens[i] = int32_t((i * 7 + size_t(m)) % size_t(cfg.vocab_size));
        ctx.targets[i] = int32_t((i * 3 + size_t(m)) % size_t(cfg.vocab_size));
      }
      for (Tensor* t : {&ctx.input, &ctx.doutput})
        for (int64_t i = 0; i < t->numel(); ++i) t->f32()[i] = 0.01f * float(i % 13);
      return B;
    };
    pipe.run(build_schedule(ScheduleKind::GPipe, 2, rank, micro, 1), load,
             1.0f / float(micro * B * T));
    // Stage 0 sends activations after its forwards, stage 1 gradients after its backwards; in
    // GPipe each is followed by another op of the same kind but for the last.
    ASSERT_EQ(comm.polls.size(), size_t(micro));
    for (int k = 0; k + 1 < micro; ++k) {
      EXPECT_GE(comm.polls[size_t(k)], 2) << "send " << k;  // once per block of the next op
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * (micro - 1));
}

}  // namespace
}  // namespace trellis
