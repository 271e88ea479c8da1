#pragma once
// Shared by the libFuzzer targets: parsers must turn any bytes into a result or a trellis input
// error (exit code 2 at the CLI). Anything else - another exception, an internal error, a crash,
// a sanitizer report - is a find.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "trellis/core/error.h"

namespace trellis::fuzz {

// A scratch directory of this process (libFuzzer's -fork/-jobs workers each have their own),
// removed at a normal exit; libFuzzer's own ends use _Exit, so run_fuzzer.sh gives each run a
// TMPDIR of its own and removes that.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/trellis-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// Writes bytes to scratch_dir()/name and returns its path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  f.close();
  if (!f) std::abort();
  return p.string();
}

// Runs a parse; an input error is the expected answer to bad bytes, an internal error is not.
template <class F>
void expect_parse_or_input_error(F&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Input) {
      std::fprintf(stderr, "internal error on input: %s\n", e.what());
      std::abort();
    }
  }
}

// A property a parsed value must have; a failure is a find.
inline void require(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "property failed: %s\n", what);
    std::abort();
  }
}

}  // namespace trellis::fuzz
