// comm/ and parallel/{mesh,data_parallel}: the single-rank backend, ZeRO shard ranges, the mesh
// on one rank and the gradient reducer's bucket schedule. Multi-rank behaviour is checked by
// tests/mpi/comm_check.cpp under mpirun (tests/parallel/test_comm_mpi.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/parallel/data_parallel.h"
#include "trellis/parallel/mesh.h"
#include "trellis/parallel/zero.h"

using namespace trellis;

namespace {

std::vector<float> iota_floats(size_t n, float start = 1.0f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

template <typename F>
std::string error_of(ErrorKind kind, F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no trellis::Error thrown";
  return "";
}

TEST(LocalComm, Identity) {
  auto c = make_local_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->world_rank(), 0);
  EXPECT_EQ(c->backend(), "local");
  EXPECT_EQ(c->name(), "world");
  c->set_timeout(7.5);
  EXPECT_EQ(c->timeout(), 7.5);
}

TEST(LocalComm, CollectivesAreIdentityOrCopies) {
  auto c = make_local_communicator();
  auto a = iota_floats(100);
  const auto ref = a;
  c->all_reduce(a.data(), a.size());
  EXPECT_EQ(a, ref);
  auto w = c->all_reduce_async(a.data(), 0);
  EXPECT_TRUE(w->test());
  w->wait();

  std::vector<float> out(100, -1.0f);
  c->reduce_scatter_async(a.data(), out.data(), out.size())->wait();
  EXPECT_EQ(out, ref);
  std::fill(out.begin(), out.end(), -1.0f);
  c->all_gather_async(a.data(), out.data(), out.size())->wait();
  EXPECT_EQ(out, ref);
  // send == recv (in place) is allowed.
  c->all_gather_async(a.data(), a.data(), a.size())->wait();
  c->reduce_scatter_async(a.data(), a.data(), a.size())->wait();
  EXPECT_EQ(a, ref);
  c->broadcast_async(a.data(), a.size(), 0)->wait();
  EXPECT_EQ(a, ref);

  double d[2] = {1.5, -2.0};
  c->all_reduce_sum(d, 2);
  c->all_reduce_max(d, 2);
  EXPECT_EQ(d[0], 1.5);
  EXPECT_EQ(d[1], -2.0);
  c->barrier();
}

TEST(LocalComm, PointToPointIsAnInternalError) {
  auto c = make_local_communicator();
  std::vector<float> buf(4);
  const std::string s =
      error_of(ErrorKind::Internal, [&] { c->send_async(buf.data(), buf.size(), 1, 0); });
  EXPECT_NE(s.find("send"), std::string::npos) << s;
  const std::string r =
      error_of(ErrorKind::Internal, [&] { c->recv_async(buf.data(), buf.size(), 1, 0); });
  EXPECT_NE(r.find("recv"), std::string::npos) << r;
  error_of(ErrorKind::Internal, [&] { c->broadcast_async(buf.data(), buf.size(), 1); });
}

TEST(LocalComm, SplitKeepsSettings) {
  auto c = make_local_communicator();
  c->set_timeout(3.0);
  c->set_name("dp");
  auto s = c->split(5, 0);
  EXPECT_EQ(s->size(), 1);
  EXPECT_EQ(s->rank(), 0);
  EXPECT_EQ(s->timeout(), 3.0);
  EXPECT_EQ(s->name(), "dp");
}

TEST(LocalComm, WorldWithoutLauncherIsLocal) {
  // ctest does not run this binary under mpirun.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK"))
    GTEST_SKIP() << "running under an MPI launcher";
  auto c = make_world_communicator(nullptr, nullptr);
  EXPECT_EQ(c->backend(), "local");
  EXPECT_EQ(c->size(), 1);
}

TEST(LocalComm, AbortPrintsAndExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(make_local_communicator()->abort("boom in all_reduce #3", 7),
              ::testing::ExitedWithCode(7), "trellis: error: boom in all_reduce #3");
}

TEST(Mesh, SingleRank) {
  auto c = make_local_communicator();
  Mesh m(*c, MeshShape{});
  EXPECT_EQ(m.dp(), 1);
  EXPECT_EQ(m.tp(), 1);
  EXPECT_EQ(m.pp(), 1);
  EXPECT_EQ(m.dp_rank() + m.tp_rank() + m.pp_rank(), 0);
  EXPECT_EQ(m.dp_comm().name(), "dp");
  EXPECT_EQ(m.tp_comm().name(), "tp");
  EXPECT_EQ(m.pp_comm().name(), "pp");
  EXPECT_EQ(&m.world(), c.get());
}

TEST(Mesh, LayoutMismatchIsAnInputError) {
  auto c = make_local_communicator();
  const std::string s = error_of(ErrorKind::Input, [&] { Mesh m(*c, MeshShape{2, 1, 1}); });
  EXPECT_EQ(s, "layout dp=2 x tp=1 x pp=1 = 2 does not match the world size 1");
  const std::string t = error_of(ErrorKind::Input, [&] { Mesh m(*c, MeshShape{0, 2, 1}); });
  EXPECT_NE(t.find("does not divide the world size 1"), std::string::npos) << t;
  error_of(ErrorKind::Input, [&] { Mesh m(*c, MeshShape{1, 0, 1}); });
}

TEST(ShardRange, EvenSplit) {
  for (int r = 0; r < 4; ++r) {
    const ShardRange s = shard_range(100, 4, r);
    EXPECT_EQ(s.padded, 100u);
    EXPECT_EQ(s.shard, 25u);
    EXPECT_EQ(s.begin, 25u * r);
    EXPECT_EQ(s.end, 25u * (r + 1));
  }
}

TEST(ShardRange, UnevenSplitPadsAndClips) {
  // 10 over 4: padded 12, shard 3: [0,3) [3,6) [6,9) [9,10).
  const size_t want[4][2] = {{0, 3}, {3, 6}, {6, 9}, {9, 10}};
  for (int r = 0; r < 4; ++r) {
    const ShardRange s = shard_range(10, 4, r);
    EXPECT_EQ(s.padded, 12u);
    EXPECT_EQ(s.shard, 3u);
    EXPECT_EQ(s.begin, want[r][0]) << r;
    EXPECT_EQ(s.end, want[r][1]) << r;
  }
}

TEST(ShardRange, FewerElementsThanRanks) {
  // 2 over 4: shard 1; ranks 2 and 3 own nothing.
  size_t covered = 0;
  for (int r = 0; r < 4; ++r) {
    const ShardRange s = shard_range(2, 4, r);
    EXPECT_EQ(s.padded, 4u);
    EXPECT_EQ(s.shard, 1u);
    EXPECT_LE(s.begin, s.end);
    EXPECT_LE(s.end, 2u);
    covered += s.end - s.begin;
  }
  EXPECT_EQ(covered, 2u);
  const ShardRange z = shard_range(0, 3, 2);
  EXPECT_EQ(z.padded, 0u);
  EXPECT_EQ(z.begin, 0u);
  EXPECT_EQ(z.end, 0u);
}

TEST(ShardRange, CoversEverythingOnce) {
  for (size_t n : {1u, 7u, 64u, 1001u}) {
    for (int dp = 1; dp <= 8; ++dp) {
      size_t next = 0;
      for (int r = 0; r < dp; ++r) {
        const ShardRange s = shard_range(n, dp, r);
        EXPECT_EQ(s.padded % dp, 0u);
        EXPECT_GE(s.padded, n);
        EXPECT_LT(s.padded - n, static_cast<size_t>(dp));
        EXPECT_EQ(s.begin, next) << n << " " << dp << " " << r;
        next = s.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

// Records every all-reduce launched and whether it was waited on; completes only in wait().
class RecordingComm final : public Communicator {
 public:
  struct Launch {
    size_t offset, n;
    bool waited = false;
    int tests = 0;
  };
  std::vector<Launch> launches;
  float* base = nullptr;

  class RecordingWork final : public Work {
   public:
    RecordingWork(RecordingComm& c, size_t i) : c_(c), i_(i) {}
    void wait() override { c_.launches[i_].waited = true; }
    bool test() override {
      ++c_.launches[i_].tests;
      return c_.launches[i_].waited;
    }

   private:
    RecordingComm& c_;
    size_t i_;
  };

  int rank() const override { return 0; }
  int size() const override { return 2; }
  int world_rank() const override { return 0; }
  std::string backend() const override { return "recording"; }
  std::unique_ptr<Work> all_reduce_async(float* buf, size_t n) override {
    launches.push_back({static_cast<size_t>(buf - base), n});
    return std::make_unique<RecordingWork>(*this, launches.size() - 1);
  }
  std::unique_ptr<Work> reduce_scatter_async(const float*, float*, size_t) override { fail(); }
  std::unique_ptr<Work> all_gather_async(const float*, float*, size_t) override { fail(); }
  std::unique_ptr<Work> broadcast_async(float*, size_t, int) override { fail(); }
  std::unique_ptr<Work> send_async(const float*, size_t, int, int) override { fail(); }
  std::unique_ptr<Work> recv_async(float*, size_t, int, int) override { fail(); }
  void all_reduce_sum(double*, size_t) override { fail(); }
  void all_reduce_max(double*, size_t) override { fail(); }
  void barrier() override { fail(); }
  std::unique_ptr<Communicator> split(int, int) override { fail(); }
  [[noreturn]] void abort(const std::string& msg, int) override { throw std::runtime_error(msg); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("unexpected operation"); }
};

TEST(GradReducer, BucketsAreCutFromTheEnd) {
  RecordingComm c;
  std::vector<float> g(1000);
  c.base = g.data();
  // 256 bytes = 64 floats: 15 full buckets from the end, the first 40 floats in the last one.
  GradReducer red(c, g.data(), g.size(), 256);
  EXPECT_EQ(red.bucket_count(), 16u);
  red.finish();
  ASSERT_EQ(c.launches.size(), 16u);
  for (size_t i = 0; i < 15; ++i) {
    EXPECT_EQ(c.launches[i].offset, 1000 - 64 * (i + 1)) << i;
    EXPECT_EQ(c.launches[i].n, 64u) << i;
  }
  EXPECT_EQ(c.launches[15].offset, 0u);
  EXPECT_EQ(c.launches[15].n, 40u);
  for (const auto& l : c.launches) EXPECT_TRUE(l.waited);
}

// Buckets end at the points backward reports (block starts), so a bucket starts with the block
// that finishes it: the one holding the first block's top does not take blocks above it along.
TEST(GradReducer, BucketsEndAtReadyPoints) {
  RecordingComm c;
  std::vector<float> g(300);
  c.base = g.data();
  // 40 floats a bucket; blocks start at 100 and 230 (given unsorted, as a layout may list them).
  GradReducer red(c, g.data(), g.size(), 160, {230, 100});
  const std::vector<std::pair<size_t, size_t>> want = {{260, 40}, {230, 30}, {190, 40},
                                                       {150, 40}, {110, 40}, {100, 10},
                                                       {60, 40},  {20, 40},  {0, 20}};
  ASSERT_EQ(red.bucket_count(), want.size());
  red.ready_from(230);  // the top block: its two buckets, nothing of the next
  ASSERT_EQ(c.launches.size(), 2u);
  red.ready_from(100);
  ASSERT_EQ(c.launches.size(), 6u);
  red.finish();
  ASSERT_EQ(c.launches.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(c.launches[i].offset, want[i].first) << i;
    EXPECT_EQ(c.launches[i].n, want[i].second) << i;
  }
  // A bucket of the whole buffer stays one all-reduce.
  GradReducer one(c, g.data(), g.size(), 300 * sizeof(float), {230, 100});
  EXPECT_EQ(one.bucket_count(), 1u);
}

TEST(GradReducer, ReadyFromLaunchesOnlyFinishedBuckets) {
  RecordingComm c;
  std::vector<float> g(100);
  c.base = g.data();
  GradReducer red(c, g.data(), g.size(), 40);  // 10 floats a bucket: [90,100) first
  ASSERT_EQ(red.bucket_count(), 10u);
  red.ready_from(95);  // [90,100) is not yet final
  EXPECT_TRUE(c.launches.empty());
  red.ready_from(90);
  ASSERT_EQ(c.launches.size(), 1u);
  EXPECT_EQ(c.launches[0].offset, 90u);
  red.ready_from(61);  // [80,90) and [70,80) are final, [60,70) is not
  ASSERT_EQ(c.launches.size(), 3u);
  EXPECT_EQ(c.launches[2].offset, 70u);
  EXPECT_GE(c.launches[0].tests, 1);  // in-flight buckets are polled for progress
  EXPECT_FALSE(c.launches[0].waited);
  red.finish();
  ASSERT_EQ(c.launches.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(c.launches[i].offset, 90 - 10 * i);
    EXPECT_TRUE(c.launches[i].waited);
  }
  EXPECT_GE(red.exposed_seconds(), 0.0);

  // Next step: the same buckets again, in the same order.
  c.launches.clear();
  red.ready_from(0);
  EXPECT_EQ(c.launches.size(), 10u);
  red.finish();
  ASSERT_EQ(c.launches.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(c.launches[i].offset, 90 - 10 * i);
}

TEST(GradReducer, EdgeSizes) {
  RecordingComm c;
  GradReducer empty(c, nullptr, 0, 1024);
  EXPECT_EQ(empty.bucket_count(), 0u);
  empty.ready_from(0);
  empty.finish();
  EXPECT_TRUE(c.launches.empty());

  std::vector<float> g(5);
  c.base = g.data();
  GradReducer one(c, g.data(), g.size(), 1 << 20);  // bucket larger than the buffer
  EXPECT_EQ(one.bucket_count(), 1u);
  GradReducer tiny(c, g.data(), g.size(), 1);  // less than a float: one float a bucket
  EXPECT_EQ(tiny.bucket_count(), 5u);
}

TEST(GradReducer, LocalCommLeavesGradientsUnchanged) {
  auto c = make_local_communicator();
  auto g = iota_floats(1000);
  const auto ref = g;
  GradReducer red(*c, g.data(), g.size(), 1024);
  EXPECT_EQ(red.bucket_count(), 4u);  // 256 floats a bucket
  for (int step = 0; step < 2; ++step) {
    for (size_t off = 1000; off > 0; off -= 100) red.ready_from(off - 100);
    red.finish();
    EXPECT_EQ(g, ref);
  }
}

}  // namespace
