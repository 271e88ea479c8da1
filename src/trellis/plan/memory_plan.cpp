#include "trellis/plan/memory_plan.h"

#include <algorithm>

#include "trellis/model/activation_memory.h"
#include "trellis/model/params.h"
#include "trellis/optim/optimizer.h"
#include "trellis/parallel/zero.h"

namespace trellis {

std::vector<int> peak_contexts(const std::vector<PipeOp>& ops, int virtual_stages) {
  std::vector<int> alive(size_t(virtual_stages), 0), peak(size_t(virtual_stages), 0);
  for (const PipeOp& op : ops) {
    int& a = alive[size_t(op.chunk)];
    a += op.forward() ? 1 : op.ends_micro_batch() ? -1 : 0;
    peak[size_t(op.chunk)] = std::max(peak[size_t(op.chunk)], a);
  }
  return peak;
}

RankChunks rank_chunks(const ModelConfig& model, int pp, int virtual_stages,
                       const std::vector<int>& layer_split, int pp_rank) {
  const int V = virtual_stages;
  const auto chunk_layers = partition_layers(model.total_layers(), pp * V, layer_split);
  RankChunks r;
  r.stage.embedding = pp_rank == 0;
  r.stage.head = pp_rank == pp - 1;
  for (int v = 0; v < V; ++v) {
    const int g = v * pp + pp_rank;
    r.chunks.push_back({chunk_layers[size_t(g)], g == 0, g == pp * V - 1});
    r.stage.layers.insert(r.stage.layers.end(), chunk_layers[size_t(g)].begin(),
                          chunk_layers[size_t(g)].end());
  }
  return r;
}

namespace {
RankMemory rank_memory(const RunShape& run, const StageSpec& stage,
                       const std::vector<StageSpec>& chunks, const std::vector<int>& contexts,
                       int pp_rank, int dp_rank, int tp_rank) {
  const ModelConfig& mc = run.model;
  const ParamLayout layout(mc, run.tp, tp_rank, &stage);
  const bool mixed = mixed_precision_state(zero_stage(run.zero), run.compute == DType::BF16);
  const ZeroFootprint z =
      zero_footprint(layout, run.dp, dp_rank, zero_stage(run.zero), mixed,
                     bf16_gradient_storage(zero_stage(run.zero), run.grad_dtype, run.dp,
                                           run.tp, run.pp));
  RankMemory m;
  m.rank = (pp_rank * run.dp + dp_rank) * run.tp + tp_rank;
  m.dp_rank = dp_rank;
  m.tp_rank = tp_rank;
  m.pp_rank = pp_rank;
  m.params = z.params;
  m.grads = z.grads;
  m.shards = z.shards;
  m.buffers = z.buffers;
  m.optimizer = Optimizer::state_tensors(run.optimizer) * z.owned * int64_t(sizeof(float));
  for (int v = 0; v < run.virtual_stages; ++v) {
    const ActivationMemory a = activation_memory(
        mc, chunks[size_t(v)], run.micro_batch, run.seq_len, run.tp, run.sequence_parallel,
        run.recompute, run.compute, splits_backward(run.schedule));
    m.activations += contexts[size_t(v)] * a.context;
    m.workspace += a.workspace;
    m.contexts += contexts[size_t(v)];
    // Mixed-precision state keeps no copies: the working weights are counted in params.
    if (run.compute == DType::BF16 && !mixed &&
        training_weight_copies(run.zero) != ModelChunk::WeightCopyPolicy::Off)
      m.weight_copies += weight_copy_bytes(layout, chunks[size_t(v)]);
  }
  return m;
}
}  // namespace

RankMemory predict_rank_memory(const RunShape& run, int pp_rank, int dp_rank, int tp_rank) {
  const RankChunks r =
      rank_chunks(run.model, run.pp, run.virtual_stages, run.layer_split, pp_rank);
  const std::vector<int> contexts = peak_contexts(
      build_schedule(run.schedule, run.pp, pp_rank, int(run.accum), run.virtual_stages),
      run.virtual_stages);
  return rank_memory(run, r.stage, r.chunks, contexts, pp_rank, dp_rank, tp_rank);
}

std::vector<RankMemory> predict_memory(const RunShape& run) {
  std::vector<RankMemory> out;
  for (int pp_rank = 0; pp_rank < run.pp; ++pp_rank) {
    const RankChunks r =
        rank_chunks(run.model, run.pp, run.virtual_stages, run.layer_split, pp_rank);
    const std::vector<int> contexts = peak_contexts(
        build_schedule(run.schedule, run.pp, pp_rank, int(run.accum), run.virtual_stages),
        run.virtual_stages);
    for (int dp_rank = 0; dp_rank < run.dp; ++dp_rank)
      for (int tp_rank = 0; tp_rank < run.tp; ++tp_rank)
        out.push_back(rank_memory(run, r.stage, r.chunks, contexts, pp_rank, dp_rank, tp_rank));
  }
  std::sort(out.begin(), out.end(),
            [](const RankMemory& a, const RankMemory& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace trellis
