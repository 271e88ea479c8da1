#include "trellis/plan/memory_plan.h"

#include <algorithm>

#include "trellis/model/activation_memory.h"
#include "trellis/model/params.h"
#include "trellis/parallel/zero.h"

namespace trellis {

std::vector<int> peak_contexts(const std::vector<PipeOp>& ops, int virtual_stages) {
  std::vector<int> alive(size_t(virtual_stages), 0), peak(size_t(virtual_stages), 0);
  for (const PipeOp& op : ops) {
    int& a = alive[size_t(op.chunk)];
    a += op.forward ? 1 : -1;
    peak[size_t(op.chunk)] = std::max(peak[size_t(op.chunk)], a);
  }
  return peak;
}

namespace {
// The chunks of pipeline rank pp_rank (local v: global chunk v * pp + pp_rank) and its stage.
StageSpec rank_chunks(const RunShape& run, int pp_rank, std::vector<StageSpec>& chunks) {
  const int pp = run.pp, V = run.virtual_stages;
  const auto chunk_layers = partition_layers(run.model.total_layers(), pp * V, run.layer_split);
  StageSpec stage;
  stage.embedding = pp_rank == 0;
  stage.head = pp_rank == pp - 1;
  for (int v = 0; v < V; ++v) {
    const int g = v * pp + pp_rank;
    chunks.push_back({chunk_layers[size_t(g)], g == 0, g == pp * V - 1});
    stage.layers.insert(stage.layers.end(), chunk_layers[size_t(g)].begin(),
                        chunk_layers[size_t(g)].end());
  }
  return stage;
}

RankMemory rank_memory(const RunShape& run, const StageSpec& stage,
                       const std::vector<StageSpec>& chunks, const std::vector<int>& contexts,
                       int pp_rank, int dp_rank, int tp_rank) {
  const ModelConfig& mc = run.model;
  const int64_t state_tensors = run.optimizer == "adamw" ? 2 : 1;
  const ParamLayout layout(mc, run.tp, tp_rank, &stage);
  const ZeroFootprint z = zero_footprint(layout, run.dp, dp_rank, zero_stage(run.zero));
  RankMemory m;
  m.rank = (pp_rank * run.dp + dp_rank) * run.tp + tp_rank;
  m.dp_rank = dp_rank;
  m.tp_rank = tp_rank;
  m.pp_rank = pp_rank;
  m.params = z.params;
  m.grads = z.grads;
  m.shards = z.shards;
  m.optimizer = state_tensors * z.owned * int64_t(sizeof(float));
  for (int v = 0; v < run.virtual_stages; ++v) {
    const ActivationMemory a =
        activation_memory(mc, chunks[size_t(v)], run.micro_batch, run.seq_len, run.tp,
                          run.sequence_parallel, run.recompute, run.compute);
    m.activations += contexts[size_t(v)] * a.context;
    m.workspace += a.workspace;
    m.contexts += contexts[size_t(v)];
  }
  return m;
}
}  // namespace

RankMemory predict_rank_memory(const RunShape& run, int pp_rank, int dp_rank, int tp_rank) {
  std::vector<StageSpec> chunks;
  const StageSpec stage = rank_chunks(run, pp_rank, chunks);
  const std::vector<int> contexts = peak_contexts(
      build_schedule(run.schedule, run.pp, pp_rank, int(run.accum), run.virtual_stages),
      run.virtual_stages);
  return rank_memory(run, stage, chunks, contexts, pp_rank, dp_rank, tp_rank);
}

std::vector<RankMemory> predict_memory(const RunShape& run) {
  std::vector<RankMemory> out;
  for (int pp_rank = 0; pp_rank < run.pp; ++pp_rank) {
    std::vector<StageSpec> chunks;
    const StageSpec stage = rank_chunks(run, pp_rank, chunks);
    const std::vector<int> contexts = peak_contexts(
        build_schedule(run.schedule, run.pp, pp_rank, int(run.accum), run.virtual_stages),
        run.virtual_stages);
    for (int dp_rank = 0; dp_rank < run.dp; ++dp_rank)
      for (int tp_rank = 0; tp_rank < run.tp; ++tp_rank)
        out.push_back(rank_memory(run, stage, chunks, contexts, pp_rank, dp_rank, tp_rank));
  }
  std::sort(out.begin(), out.end(),
            [](const RankMemory& a, const RankMemory& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace trellis
