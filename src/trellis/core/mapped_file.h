#pragma once
// A read-only memory map of a whole file. Pages are read on first touch, so opening a file of any
// size costs one mmap; a reader that touches a few windows pays for those pages only.
#include <cstddef>
#include <cstdint>
#include <string>

namespace trellis {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path`; a missing or unreadable file is an input error naming it. An empty file maps to
  // no memory (data() is null, size() 0).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops this process's mappings of the pages (they stay in the page cache; the next read
  // faults them back in cheaply), so what was read stops counting in the resident set.
  void release_pages() const;

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trellis
