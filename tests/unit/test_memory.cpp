// core/memory: the allocator counters and PageBuffer's page accounting, which the memory
// prediction (train --dry-run) is checked against.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

// ZeRO-2/3 commit a released range just before a GEMM accumulates into it (reads it first): the
// commit must have faulted its pages in for writing, or each page faults twice (the zero page,
// then its copy, which flushes every CPU's TLB: ~70 µs per 4 KiB page on the reference VM).
TEST(Memory, PageBufferCommitFaultsReleasedPagesInForWriting) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), page_floats = page / sizeof(float);
  const size_t huge_floats = (size_t(2) << 20) / sizeof(float);
  PageBuffer b(2 * huge_floats + 8 * page_floats);
  b.commit(0, b.size());
  for (size_t i = 0; i < b.size(); ++i) b.data()[i] = 1.0f;
  // Whole huge pages and 4 KiB pages cut at both edges.
  const size_t lo = 3 * page_floats + 5, hi = b.size() - 2 * page_floats - 7;
  const size_t first = (lo + page_floats - 1) / page_floats, stop = hi / page_floats;
  auto resident_pages = [&] {
    std::vector<unsigned char> in(stop - first);
    EXPECT_EQ(
        mincore(reinterpret_cast<char*>(b.data()) + first * page, (stop - first) * page, in.data()),
        0);
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  b.release(lo, hi);
  ASSERT_EQ(resident_pages(), 0u);  // given back: the check below would see a kept page
  b.commit(lo, hi);
  EXPECT_EQ(resident_pages(), stop - first);
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  for (size_t i = lo; i < hi; ++i) b.data()[i] += 2.0f;  // read, then write
  getrusage(RUSAGE_THREAD, &after);
  EXPECT_EQ(after.ru_minflt - before.ru_minflt, 0) << "faults while accumulating into a commit";
  for (size_t i = 0; i < b.size(); ++i)
    ASSERT_EQ(b.data()[i], i >= lo && i < hi ? 2.0f : 1.0f) << i;
}

}  // namespace
}  // namespace trellis
