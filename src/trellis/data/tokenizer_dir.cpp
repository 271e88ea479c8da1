#include "trellis/data/tokenizer_dir.h"

#include <filesystem>

namespace trellis {

namespace fs = std::filesystem;

namespace {
// Absolute and lexically normal, without a trailing separator.
fs::path normal(const std::string& p) {
  const fs::path a = fs::absolute(p).lexically_normal();
  return a.has_filename() || a == a.root_path() ? a : a.parent_path();
}
}  // namespace

std::string recorded_tokenizer_dir(const std::string& tokenizer_dir, const std::string& data_dir) {
  if (tokenizer_dir.empty()) return {};
  const fs::path tok = normal(tokenizer_dir);
  const fs::path rel = tok.lexically_relative(normal(data_dir));
  int up = 0, down = 0;
  for (const fs::path& part : rel) {
    if (part == "..")
      ++up;
    else if (part != "." && !part.empty())
      ++down;
  }
  // Inside the data directory (or it), or inside its parent but not the parent itself.
  const bool near = !rel.empty() && (up == 0 || (up == 1 && down > 0));
  return near ? rel.generic_string() : tok.string();
}

std::string resolved_tokenizer_dir(const std::string& recorded, const std::string& data_dir) {
  if (recorded.empty() || fs::path(recorded).is_absolute()) return recorded;
  return (fs::absolute(data_dir) / recorded).lexically_normal().string();
}

}  // namespace trellis
