#include "trellis/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "trellis/core/error.h"

namespace trellis {

namespace {

// Throws after removing the temp file, so a failed write never leaves debris next to `path`.
[[noreturn]] void fail(const std::string& path, const std::string& tmp, std::FILE* f,
                       const char* what, int err) {
  if (f != nullptr) std::fclose(f);
  std::remove(tmp.c_str());
  TRELLIS_REQUIRE(false, "{}: cannot write ({}): {}", path, what, std::strerror(err));
  __builtin_unreachable();
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  // Same directory as the target: rename(2) is only atomic within one file system.
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail(path, tmp, nullptr, "open temp file", errno);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
    fail(path, tmp, f, "fwrite", errno);
  if (std::fflush(f) != 0) fail(path, tmp, f, "fflush", errno);
  // fsync before rename: otherwise a crash can leave the new name pointing at empty data.
  if (::fsync(::fileno(f)) != 0) fail(path, tmp, f, "fsync", errno);
  if (std::fclose(f) != 0) fail(path, tmp, nullptr, "fclose", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, tmp, nullptr, "rename", errno);
  // Persist the rename itself; best effort, a failure here does not lose the file's contents.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TRELLIS_REQUIRE(f != nullptr, "{}: cannot open: {}", path, std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const bool bad = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TRELLIS_REQUIRE(!bad, "{}: cannot read: {}", path, std::strerror(err));
  return out;
}

}  // namespace trellis
