#include "trellis/core/memory.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "trellis/core/error.h"

// Linux 5.14; older headers lack the name (the call then fails with EINVAL, see populate).
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace trellis::memory {
namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};
}  // namespace

// Internal: the allocation hooks below and PageBuffer report here.
void add(int64_t bytes) {
  const int64_t now = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void sub(int64_t bytes) { g_live.fetch_sub(bytes, std::memory_order_relaxed); }

int64_t live_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak() { g_peak.store(g_live.load(std::memory_order_relaxed)); }

}  // namespace trellis::memory

namespace trellis {

PageBuffer::PageBuffer(size_t floats) : floats_(floats) {
  page_ = size_t(sysconf(_SC_PAGESIZE));
  bytes_ = std::max<size_t>(page_, (floats * sizeof(float) + page_ - 1) / page_ * page_);
  // Transparent huge pages where the kernel allows them (madvise mode): a released range comes
  // back with one fault per 2 MiB instead of one per 4 KiB, which dominates under a hypervisor
  // (0.27 GB/s with small pages on the reference VM). The mapping is aligned to 2 MiB for it.
  constexpr size_t kHuge = size_t(2) << 20;
  map_bytes_ = bytes_ + kHuge;
  void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TRELLIS_CHECK(p != MAP_FAILED, "cannot map {} bytes for a parameter/gradient buffer", bytes_);
  base_ = p;
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge;
  data_ = reinterpret_cast<float*>(aligned);
  madvise(data_, bytes_, MADV_HUGEPAGE);
  live_.assign(bytes_ / page_, 0);
}

PageBuffer::~PageBuffer() {
  if (!data_) return;
  memory::sub(committed_bytes());
  munmap(base_, map_bytes_);
}

PageBuffer& PageBuffer::operator=(PageBuffer&& o) noexcept {
  if (this != &o) {
    this->~PageBuffer();
    data_ = std::exchange(o.data_, nullptr);
    base_ = std::exchange(o.base_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    floats_ = std::exchange(o.floats_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    page_ = o.page_;
    live_ = std::move(o.live_);
    committed_ = std::exchange(o.committed_, 0);
  }
  return *this;
}

void PageBuffer::commit(size_t begin, size_t end) {
  if (begin >= end) return;
  const size_t first = begin * sizeof(float) / page_, last = (end * sizeof(float) - 1) / page_;
  int64_t added = 0;
  for (size_t p = first; p <= last;) {
    if (live_[p]) {
      ++p;
      continue;
    }
    size_t q = p;
    while (q <= last && !live_[q]) live_[q++] = 1;
    added += int64_t(q - p);
    populate(p, q);
    p = q;
  }
  committed_ += added;
  memory::add(added * int64_t(page_));
}

void PageBuffer::populate(size_t first, size_t stop) {
  // Fault the pages in for writing now, in one call. Left to the first touch, a released page
  // that is read before it is written (a GEMM accumulating into it, beta = 1) maps the shared
  // zero page and then copies it on the write, and that copy flushes the TLB of every CPU the
  // process's threads (MPI's progress thread) ran on: measured ~70 µs per 4 KiB page on the
  // reference VM, against ~10 µs here; and a 2 MiB range read first comes back as 4 KiB pages.
  // Kernels before 5.14 lack the call (EINVAL): the pages then fault on first touch as before.
  madvise(reinterpret_cast<char*>(data_) + first * page_, (stop - first) * page_,
          MADV_POPULATE_WRITE);
}

void PageBuffer::release(size_t begin, size_t end) {
  if (begin >= end) return;
  const size_t b = begin * sizeof(float), e = end * sizeof(float);
  const size_t first = (b + page_ - 1) / page_, stop = e / page_;  // whole pages [first, stop)
  if (first >= stop) {
    std::memset(data_ + begin, 0, e - b);
    return;
  }
  std::memset(data_ + begin, 0, first * page_ - b);
  std::memset(reinterpret_cast<char*>(data_) + stop * page_, 0, e - stop * page_);
  madvise(reinterpret_cast<char*>(data_) + first * page_, (stop - first) * page_, MADV_DONTNEED);
  int64_t freed = 0;
  for (size_t p = first; p < stop; ++p)
    if (live_[p]) live_[p] = 0, ++freed;
  committed_ -= freed;
  memory::sub(freed * int64_t(page_));
}

}  // namespace trellis

// Every C++ heap allocation of the process is counted (replacing the global operators: this
// object is linked wherever the counters are read).
namespace {
void* counted(void* p) {
  if (!p) throw std::bad_alloc();
  trellis::memory::add(int64_t(malloc_usable_size(p)));
  return p;
}
void uncounted(void* p) noexcept {
  if (!p) return;
  trellis::memory::sub(int64_t(malloc_usable_size(p)));
  std::free(p);
}
size_t nonzero(size_t n) { return n ? n : 1; }
}  // namespace

void* operator new(size_t n) { return counted(std::malloc(nonzero(n))); }
void* operator new[](size_t n) { return counted(std::malloc(nonzero(n))); }
void* operator new(size_t n, std::align_val_t a) {
  const size_t al = size_t(a), rounded = (nonzero(n) + al - 1) / al * al;
  return counted(std::aligned_alloc(al, rounded));
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, size_t) noexcept { uncounted(p); }
void operator delete[](void* p, size_t) noexcept { uncounted(p); }
void operator delete(void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { uncounted(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { uncounted(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { uncounted(p); }
