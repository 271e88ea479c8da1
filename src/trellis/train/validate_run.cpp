#include "trellis/train/validate_run.h"

#include <algorithm>
#include <cstdlib>

#include "trellis/core/error.h"
#include "trellis/kernels/isa.h"
#include "trellis/parallel/mesh.h"
#include "trellis/plan/run_shape.h"

namespace trellis {

std::vector<int> parse_layer_split(const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    TRELLIS_REQUIRE(!item.empty() && *end == '\0' && v >= 1,
                    "layer_split: '{}' is not a positive layer count (e.g. layer_split=3,1)", item);
    out.push_back(int(v));
    pos = comma + 1;
  }
  return out;
}

RunShape validate_run(const TrainConfig& cfg, int world_size, const RunData& data) {
  const MeshShape mesh = resolve_mesh_shape({cfg.dp, cfg.tp, cfg.pp}, world_size);
  RunShape run;
  run.model = data.model;
  run.seq_len = data.T;
  run.dp = mesh.dp;
  run.tp = mesh.tp;
  run.pp = mesh.pp;
  run.virtual_stages = cfg.virtual_stages;
  run.zero = cfg.zero;
  run.sequence_parallel = cfg.sequence_parallel && mesh.tp > 1;
  run.schedule = parse_schedule(cfg.schedule);
  run.recompute = parse_recompute(cfg.recompute);
  run.layer_split = parse_layer_split(cfg.layer_split);
  const int64_t G = cfg.batch_size, dp = run.dp;
  TRELLIS_REQUIRE(G >= 1 && G % dp == 0, "batch_size {} is not a positive multiple of dp={}", G,
                  dp);
  const int64_t per_rank = G / dp;
  run.micro_batch = cfg.micro_batch_size > 0 ? cfg.micro_batch_size : per_rank;
  TRELLIS_REQUIRE(
      per_rank % run.micro_batch == 0,
      "micro_batch_size {} does not divide the per-rank batch {} (batch_size {} / dp {})",
      run.micro_batch, per_rank, G, dp);
  run.accum = per_rank / run.micro_batch;
  run.optimizer = cfg.optim.name;
  run.compute = choose_precision(cfg.precision).compute;
  run.grad_dtype = grad_reduce_dtype(cfg.grad_reduce_dtype);
  check_run_shape(run);
  return run;
}

}  // namespace trellis
