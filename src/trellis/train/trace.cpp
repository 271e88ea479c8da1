#include "trellis/train/trace.h"

#include <fmt/format.h>

#include "nlohmann/json.hpp"
#include "trellis/core/atomic_file.h"

namespace trellis {

// Writes the per-rank schedule timelines as a Chrome trace (chrome://tracing, Perfetto).
void write_trace(const std::string& path, Communicator& world, const Mesh& mesh,
                 const std::vector<TraceEvent>& events) {
  // Ranks record different numbers of events: pad to the largest and sum (others add zeros).
  double count = double(events.size());
  world.all_reduce_max(&count, 1);
  const size_t per = size_t(count), fields = 6;
  std::vector<double> all(per * fields * size_t(world.size()), 0.0);
  std::vector<double> coords(size_t(world.size()) * 3, 0.0);
  for (size_t i = 0; i < events.size(); ++i) {
    double* e = all.data() + (size_t(world.rank()) * per + i) * fields;
    e[0] = events[i].start_us, e[1] = events[i].dur_us, e[2] = events[i].micro;
    e[3] = events[i].chunk, e[4] = 1.0 + double(events[i].pass);  // 0: padding
    e[5] = events[i].compute_us;
  }
  double* c = coords.data() + size_t(world.rank()) * 3;
  c[0] = mesh.pp_rank(), c[1] = mesh.dp_rank(), c[2] = mesh.tp_rank();
  world.all_reduce_sum(all.data(), all.size());
  world.all_reduce_sum(coords.data(), coords.size());
  if (world.rank() != 0) return;
  nlohmann::json trace = nlohmann::json::array();
  for (int r = 0; r < world.size(); ++r) {
    const double* rc = coords.data() + size_t(r) * 3;
    trace.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", r},
         {"args",
          {{"name", fmt::format("rank {} (pp {}, dp {}, tp {})", r, rc[0], rc[1], rc[2])}}}});
    for (size_t i = 0; i < per; ++i) {
      const double* e = all.data() + (size_t(r) * per + i) * fields;
      if (e[4] == 0.0) continue;
      // Forward, Backward, Input (a split backward's input part), Weight (its weight part).
      const int pass = int(e[4]) - 1;
      static const char* const letter[] = {"F", "B", "B", "W"};
      static const char* const category[] = {"forward", "backward", "input_grad", "weight_grad"};
      trace.push_back({{"name", fmt::format("{}{}", letter[pass], int(e[2]))},
                       {"cat", category[pass]},
                       {"ph", "X"},
                       {"pid", 0},
                       {"tid", r},
                       {"ts", e[0]},
                       {"dur", e[1]},
                       {"args",
                        {{"micro_batch", int(e[2])}, {"chunk", int(e[3])}, {"compute_us", e[5]}}}});
    }
  }
  write_file_atomic(path, nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump());
}

}  // namespace trellis
