#pragma once
// What this process holds, as the allocator sees it: bytes live in C++ heap allocations (every
// operator new: tensors, vectors, strings) plus the committed pages of PageBuffers, and their
// high-water mark. The counters are what `--dry-run`'s prediction is checked against; peak RSS
// (the kernel's view) also counts libraries' own allocations, code and mapped files.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace trellis::memory {

int64_t live_bytes();
int64_t peak_bytes();
// Starts a new high-water mark at the current live bytes (e.g. when training steps begin).
void reset_peak();

}  // namespace trellis::memory

namespace trellis {

// A large float buffer whose pages are committed and returned to the system by range: ZeRO-3
// holds a block's gathered parameters only while the block runs, ZeRO-2 a block's gradients
// only until they are reduced. Pointers into it stay valid (the model keeps views of the whole
// buffer); a released range reads as zeros. Backed by an anonymous mapping, so released pages
// leave the process (madvise), whatever malloc's settings.
class PageBuffer {
 public:
  PageBuffer() = default;
  explicit PageBuffer(size_t floats);
  ~PageBuffer();
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  PageBuffer(PageBuffer&& o) noexcept { *this = std::move(o); }
  PageBuffer& operator=(PageBuffer&& o) noexcept;
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return floats_; }
  // Counts the pages touching [begin, end) as live (they are, or are about to be, written) and
  // faults those that were not in, writable and zero.
  void commit(size_t begin, size_t end);
  // Zeroes [begin, end) and returns the pages lying wholly inside it to the system.
  void release(size_t begin, size_t end);
  // Bytes of pages counted live.
  int64_t committed_bytes() const { return committed_ * int64_t(page_); }

 private:
  void populate(size_t first, size_t stop);  // pages [first, stop)

  float* data_ = nullptr;  // 2 MiB-aligned inside the mapping [base_, base_ + map_bytes_)
  void* base_ = nullptr;
  size_t floats_ = 0, bytes_ = 0, page_ = 0, map_bytes_ = 0;
  std::vector<uint8_t> live_;  // per page
  int64_t committed_ = 0;      // pages
};

}  // namespace trellis
