#pragma once
// Atomic writes: write a temp sibling, fsync, rename. A crash leaves the old file or none.
#include <string>
#include <string_view>

namespace trellis {

void write_file_atomic(const std::string& path, std::string_view bytes);
// Reads a whole file; a missing/unreadable file is an input error naming it.
std::string read_file(const std::string& path);

}  // namespace trellis
