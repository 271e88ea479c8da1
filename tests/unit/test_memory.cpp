// core/memory: the allocator counters and PageBuffer's page accounting, which the memory
// prediction (train --dry-run) is checked against.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "trellis/core/memory.h"

namespace trellis {
namespace {

TEST(Memory, CountsHeapAllocationsAndTheirPeak) {
  memory::reset_peak();
  const int64_t before = memory::live_bytes();
  {
    std::vector<float> v(1 << 20);  // 4 MiB
    EXPECT_GE(memory::live_bytes() - before, int64_t(4) << 20);
  }
  EXPECT_LT(memory::live_bytes() - before, int64_t(1) << 20);  // freed
  EXPECT_GE(memory::peak_bytes() - before, int64_t(4) << 20);  // but remembered
  memory::reset_peak();
  EXPECT_EQ(memory::peak_bytes(), memory::live_bytes());
}

TEST(Memory, PageBufferCommitsAndReleasesWholePages) {
  const size_t page_floats = size_t(sysconf(_SC_PAGESIZE)) / sizeof(float);
  const int64_t page = int64_t(page_floats * sizeof(float));
  const int64_t before = memory::live_bytes();
  {
    PageBuffer b(10 * page_floats);
    // Aligned for transparent huge pages: a released range's whole 2 MiB pages refill with one
    // fault each.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t(2) << 20), 0u);
    EXPECT_EQ(b.committed_bytes(), 0);
    b.commit(0, 10 * page_floats);
    EXPECT_EQ(b.committed_bytes(), 10 * page);
    // The pages, and the buffer's own small page map on the heap.
    EXPECT_GE(memory::live_bytes() - before, 10 * page);
    EXPECT_LT(memory::live_bytes() - before, 10 * page + 1024);
    for (size_t i = 0; i < b.size(); ++i) b.data()[i] = 1.0f;
    // From the middle of page 2 to the middle of page 6: pages 3-5 go, 2 and 6 stay (their other
    // halves belong to neighbours), and the whole range reads as zeros.
    const size_t lo = 2 * page_floats + page_floats / 2, hi = 6 * page_floats + page_floats / 2;
    b.release(lo, hi);
    EXPECT_EQ(b.committed_bytes(), 7 * page);
    for (size_t i = 0; i < b.size(); ++i)
      ASSERT_EQ(b.data()[i], i >= lo && i < hi ? 0.0f : 1.0f) << i;
    b.commit(lo, hi);  // pages 3-5 again
    EXPECT_EQ(b.committed_bytes(), 10 * page);
  }
  EXPECT_EQ(memory::live_bytes(), before);  // the mapping's pages are uncounted when it goes
}

}  // namespace
}  // namespace trellis
