// Pipeline schedules: every micro-batch of every chunk runs forward then backward exactly once
// (zb1: forward, input-gradient part, weight-gradient part), all ranks together never deadlock
// (simulated message passing), 1F1B bounds the activations alive on a rank by the number of
// stages (zb1 too: rank 0's 1F1B peak on every rank), and with unit op times zb1's bubble is
// under half of 1F1B's.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "trellis/core/error.h"
#include "trellis/parallel/pipeline/schedule.h"

namespace trellis {
namespace {

struct SimResult {
  bool completed = false;
  std::vector<int> peak_alive;  // per rank
  double makespan = 0;          // with unit-time forwards, input and weight parts
};

// Runs all ranks' op lists with unbounded asynchronous sends: a forward of global chunk g > 0
// waits for the forward of g - 1, a backward (or input-gradient part) of g < last for the
// backward of g + 1; a weight part depends on its own rank's input part only. Each op takes one
// unit (a whole backward two: input and weight), so `makespan` is the idealised step.
SimResult simulate(ScheduleKind kind, int pp, int m, int V) {
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < pp; ++r) ops.push_back(build_schedule(kind, pp, r, m, V));
  const int last = pp * V - 1;
  std::map<std::tuple<Pass, int, int>, double> done;  // (pass, micro, global chunk) -> end time
  // Input parts stand for the backward their neighbour waits for.
  auto backward_done = [&](int micro, int g) {
    auto it = done.find({Pass::Backward, micro, g});
    if (it == done.end()) it = done.find({Pass::Input, micro, g});
    return it == done.end() ? -1.0 : it->second;
  };
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<int> alive(size_t(pp), 0);
  std::vector<double> clock(size_t(pp), 0.0);
  SimResult res;
  res.peak_alive.assign(size_t(pp), 0);
  size_t ran = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[size_t(r)] < ops[size_t(r)].size()) {
        const PipeOp& op = ops[size_t(r)][next[size_t(r)]];
        const int g = op.chunk * pp + r;
        double ready = 0;
        if (op.pass == Pass::Forward) {
          if (g > 0) {
            auto it = done.find({Pass::Forward, op.micro, g - 1});
            if (it == done.end()) break;
            ready = it->second;
          }
        } else if (op.pass == Pass::Weight) {
          auto it = done.find({Pass::Input, op.micro, g});
          if (it == done.end()) break;
          ready = it->second;
        } else {
          auto f = done.find({Pass::Forward, op.micro, g});
          if (f == done.end()) break;
          ready = f->second;
          if (g < last) {
            const double b = backward_done(op.micro, g + 1);
            if (b < 0) break;
            ready = std::max(ready, b);
          }
        }
        const double start = std::max(clock[size_t(r)], ready);
        clock[size_t(r)] = start + (op.pass == Pass::Backward ? 2.0 : 1.0);
        EXPECT_TRUE(done.insert({{op.pass, op.micro, g}, clock[size_t(r)]}).second)
            << "an op twice: rank " << r << " micro " << op.micro;
        alive[size_t(r)] += op.forward() ? 1 : op.ends_micro_batch() ? -1 : 0;
        res.peak_alive[size_t(r)] = std::max(res.peak_alive[size_t(r)], alive[size_t(r)]);
        ++next[size_t(r)];
        ++ran;
        progress = true;
      }
    }
  }
  const size_t per_micro = splits_backward(kind) ? 3 : 2;
  res.completed = ran == per_micro * size_t(m * pp * V);
  res.makespan = *std::max_element(clock.begin(), clock.end());
  return res;
}

// Every (micro-batch, chunk) of every rank runs its passes once, in order: forward, then its
// backward, or its input part then its weight part.
void expect_complete_and_exact(ScheduleKind kind, int pp, int m, int V) {
  const bool split = splits_backward(kind);
  for (int r = 0; r < pp; ++r) {
    std::map<std::pair<int, int>, int> seen;  // (micro, chunk) -> passes done
    for (const PipeOp& op : build_schedule(kind, pp, r, m, V)) {
      int& state = seen[{op.micro, op.chunk}];
      const int expected = op.pass == Pass::Forward ? 0 : op.pass == Pass::Weight ? 2 : 1;
      EXPECT_EQ(state, expected) << "rank " << r << " micro " << op.micro;
      if (!op.forward()) EXPECT_EQ(op.pass != Pass::Backward, split);
      state = expected + 1;
    }
    EXPECT_EQ(seen.size(), size_t(m * V));
    for (const auto& [key, state] : seen) EXPECT_EQ(state, split ? 3 : 2);
  }
}

TEST(PipelineSchedule, EveryOpOnceAndNoDeadlock) {
  for (int pp : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      SCOPED_TRACE("pp=" + std::to_string(pp) + " m=" + std::to_string(m));
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        SCOPED_TRACE(schedule_name(kind));
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

TEST(PipelineSchedule, ZeroBubbleEveryOpOnceNoDeadlockAndOneFOneBsMemory) {
  for (int pp : {2, 3, 4})
    for (int m = 1; m <= 8; ++m) {
      SCOPED_TRACE("pp=" + std::to_string(pp) + " m=" + std::to_string(m));
      expect_complete_and_exact(ScheduleKind::ZeroBubble, pp, m, 1);
      const SimResult zb = simulate(ScheduleKind::ZeroBubble, pp, m, 1);
      EXPECT_TRUE(zb.completed);
      const SimResult one = simulate(ScheduleKind::OneFOneB, pp, m, 1);
      const int one_peak = *std::max_element(one.peak_alive.begin(), one.peak_alive.end());
      for (int r = 0; r < pp; ++r) EXPECT_LE(zb.peak_alive[size_t(r)], one_peak) << "rank " << r;
      // Never slower than 1F1B with the same unit times; from m = pp on, the paper's
      // 3m + (p - 1) (idle (p - 1)(T_F + T_B - T_W)), under half of 1F1B's idle time.
      EXPECT_LE(zb.makespan, one.makespan);
      if (m >= pp) {
        EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * m + pp - 1);
        const double busy = 3.0 * m;
        EXPECT_LE(zb.makespan - busy, 0.5 * (one.makespan - busy));
        EXPECT_NEAR(1.0 - busy / zb.makespan,
                    theoretical_bubble(pp, m, 1, ScheduleKind::ZeroBubble), 1e-12);
        EXPECT_NEAR(1.0 - busy / one.makespan, theoretical_bubble(pp, m, 1), 1e-12);
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
  EXPECT_THROW(build_schedule(ScheduleKind::ZeroBubble, 2, 0, 4, 2), Error);  // no interleaving
  EXPECT_EQ(parse_schedule("zb1"), ScheduleKind::ZeroBubble);
  EXPECT_EQ(schedule_name(ScheduleKind::ZeroBubble), "zb1");
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
