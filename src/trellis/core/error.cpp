#include "trellis/core/error.h"

#include <cstring>

namespace trellis::detail {

void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg) {
  if (file == nullptr) throw Error(kind, msg);
  const char* base = std::strstr(file, "src/trellis/");
  throw Error(kind, fmt::format("{} ({}:{})", msg, base ? base + 4 : file, line));
}

}  // namespace trellis::detail
