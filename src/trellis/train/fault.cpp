#include "trellis/train/fault.h"

#include <csignal>
#include <cstdlib>
#include <optional>
#include <string>

#include "trellis/core/error.h"

namespace trellis {

namespace {
struct Fault {
  int rank = -1;
  int64_t step = -1;
  int restart = 0;  // -1: any
};

int64_t parse_int(const std::string& v, const std::string& what) {
  size_t used = 0;
  int64_t x = -1;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TRELLIS_REQUIRE(used == v.size() && x >= 0, "{}: '{}' is not a non-negative integer", what, v);
  return x;
}

std::optional<Fault> parse_fault() {
  const char* env = std::getenv("TRELLIS_FAULT");
  if (!env || !*env) return std::nullopt;
  Fault f;
  const std::string spec = env;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq),
                      value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const std::string what = "TRELLIS_FAULT " + key;
    if (key == "rank")
      f.rank = int(parse_int(value, what));
    else if (key == "step")
      f.step = parse_int(value, what);
    else if (key == "restart")
      f.restart = value == "any" ? -1 : int(parse_int(value, what));
    else
      TRELLIS_REQUIRE(false,
                      "TRELLIS_FAULT='{}': unknown part '{}' (rank=R,step=S[,restart=K|any])", spec,
                      item);
    pos = end + 1;
  }
  TRELLIS_REQUIRE(f.rank >= 0 && f.step >= 0, "TRELLIS_FAULT='{}' needs rank=R and step=S", spec);
  return f;
}
}  // namespace

int restart_count() {
  static const int n = [] {
    const char* env = std::getenv("TRELLIS_RESTART");
    return env && *env ? int(parse_int(env, "TRELLIS_RESTART")) : 0;
  }();
  return n;
}

void fault_point(int rank, int64_t step) {
  static const std::optional<Fault> fault = parse_fault();
  if (!fault || fault->rank != rank || fault->step != step) return;
  if (fault->restart != -1 && fault->restart != restart_count()) return;
  std::raise(SIGKILL);
}

}  // namespace trellis
