// Pipeline schedules: every micro-batch of every chunk runs forward then backward exactly once,
// all ranks together never deadlock (simulated message passing), and 1F1B bounds the activations
// alive on a rank by the number of stages.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "trellis/core/error.h"
#include "trellis/parallel/pipeline/schedule.h"

namespace trellis {
namespace {

struct SimResult {
  bool completed = false;
  std::vector<int> peak_alive;  // per rank
};

// Runs all ranks' op lists with unbounded asynchronous sends: a forward of global chunk g > 0
// waits for the forward of g - 1, a backward of g < last waits for the backward of g + 1.
SimResult simulate(ScheduleKind kind, int pp, int m, int V) {
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < pp; ++r) ops.push_back(build_schedule(kind, pp, r, m, V));
  const int last = pp * V - 1;
  std::set<std::tuple<bool, int, int>> done;  // (forward, micro, global chunk)
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<int> alive(size_t(pp), 0);
  SimResult res;
  res.peak_alive.assign(size_t(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[size_t(r)] < ops[size_t(r)].size()) {
        const PipeOp& op = ops[size_t(r)][next[size_t(r)]];
        const int g = op.chunk * pp + r;
        const bool ready = op.forward ? (g == 0 || done.count({true, op.micro, g - 1}))
                                      : (done.count({true, op.micro, g}) &&
                                         (g == last || done.count({false, op.micro, g + 1})));
        if (!ready) break;
        done.insert({op.forward, op.micro, g});
        alive[size_t(r)] += op.forward ? 1 : -1;
        res.peak_alive[size_t(r)] = std::max(res.peak_alive[size_t(r)], alive[size_t(r)]);
        ++next[size_t(r)];
        progress = true;
      }
    }
  }
  res.completed = done.size() == size_t(2 * m * pp * V);
  return res;
}

void expect_complete_and_exact(ScheduleKind kind, int pp, int m, int V) {
  for (int r = 0; r < pp; ++r) {
    std::map<std::pair<int, int>, int> seen;  // (micro, chunk) -> 1 after F, 2 after B
    for (const PipeOp& op : build_schedule(kind, pp, r, m, V)) {
      int& state = seen[{op.micro, op.chunk}];
      EXPECT_EQ(state, op.forward ? 0 : 1) << "rank " << r << " micro " << op.micro;
      state = op.forward ? 1 : 2;
    }
    EXPECT_EQ(seen.size(), size_t(m * V));
    for (const auto& [key, state] : seen) EXPECT_EQ(state, 2);
  }
}

TEST(PipelineSchedule, EveryOpOnceAndNoDeadlock) {
  for (int pp : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      SCOPED_TRACE("pp=" + std::to_string(pp) + " m=" + std::to_string(m));
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        expect_complete_and_exact(kind, pp, m, 1);
        EXPECT_TRUE(simulate(kind, pp, m, 1).completed);
      }
      if (pp >= 2 && m % pp == 0)
        for (int V : {2, 3}) {
          expect_complete_and_exact(ScheduleKind::Interleaved, pp, m, V);
          EXPECT_TRUE(simulate(ScheduleKind::Interleaved, pp, m, V).completed);
        }
    }
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostPpMicroBatchesAlive) {
  for (int pp : {2, 4})
    for (int m : {4, 8, 16}) {
      const SimResult one = simulate(ScheduleKind::OneFOneB, pp, m, 1);
      const SimResult gpipe = simulate(ScheduleKind::GPipe, pp, m, 1);
      for (int r = 0; r < pp; ++r) {
        EXPECT_LE(one.peak_alive[size_t(r)], pp - r);
        EXPECT_EQ(gpipe.peak_alive[size_t(r)], m);
      }
    }
}

TEST(PipelineSchedule, ImpossibleCombinationsAreRefused) {
  EXPECT_THROW(build_schedule(ScheduleKind::Interleaved, 2, 0, 3, 2), Error);  // m % pp != 0
  EXPECT_THROW(build_schedule(ScheduleKind::Interleaved, 2, 0, 4, 1), Error);  // V < 2
  EXPECT_THROW(build_schedule(ScheduleKind::OneFOneB, 2, 0, 4, 2), Error);  // V needs interleaved
  EXPECT_THROW(partition_layers(2, 4, {}), Error);                          // fewer layers
  EXPECT_THROW(partition_layers(4, 2, {3, 2}), Error);                      // wrong sum
  EXPECT_THROW(partition_layers(4, 2, {4, 0}), Error);                      // empty chunk
  EXPECT_EQ(partition_layers(5, 2, {}), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}}));
  EXPECT_EQ(partition_layers(4, 2, {3, 1}), (std::vector<std::vector<int>>{{0, 1, 2}, {3}}));
  EXPECT_DOUBLE_EQ(theoretical_bubble(4, 8, 1), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(4, 8, 2), 3.0 / 22.0);
}

}  // namespace
}  // namespace trellis
