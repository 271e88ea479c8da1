#include "trellis/plan/cost_model.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/model/activation_memory.h"
#include "trellis/model/params.h"

namespace trellis {

double model_state_bytes(double n_params, int dp, int zero, StateBytes b) {
  const double n = dp;
  const double params = zero >= 3 ? b.params / n : b.params;
  const double grads = zero >= 2 ? b.grads / n : b.grads;
  const double optimizer = zero >= 1 ? b.optimizer / n : b.optimizer;
  return n_params * (params + grads + optimizer);
}

double megatron_activation_per_layer(double s, double b, double h, double a, double t,
                                     bool sequence_parallel, Recompute recompute) {
  const double sbh = s * b * h;
  switch (recompute) {
    case Recompute::Full:
      return 2 * sbh;  // the layer's fp16 input, not divided by t
    case Recompute::Selective:
      return sequence_parallel ? 34 * sbh / t : sbh * (10 + 24 / t);
    case Recompute::None:
      break;
  }
  const double attention = 5 * a * s / (h * t);
  return sequence_parallel ? sbh * (34 / t + attention) : sbh * (10 + 24 / t + attention);
}

std::string Layout::describe() const {
  std::string s = fmt::format("dp{} tp{}{} pp{}", dp, tp, sequence_parallel ? "+sp" : "", pp);
  if (pp > 1) s += fmt::format(" {}", schedule_name(schedule));
  if (virtual_stages > 1) s += fmt::format(" v{}", virtual_stages);
  s += fmt::format(" zero{} {} mb{}x{}", zero, recompute_name(recompute), micro_batch, accum);
  return s;
}

double block_forward_flops(const ModelConfig& cfg, bool decoder, double b, double s, int tp) {
  const double h = cfg.n_embd, hd = cfg.head_size(), kv = cfg.kv_heads(), f = cfg.ffn();
  const double tokens = b * s;
  double flops = 2 * tokens * h * (h + 2 * kv * hd)  // q|k|v
                 + 4 * tokens * s * h                // scores and probabilities x values
                 + 2 * tokens * h * h;               // output projection
  if (cfg.mlp == MlpKind::Gelu) flops += 4 * tokens * h * f;
  if (cfg.mlp == MlpKind::SwiGLU) flops += 6 * tokens * h * f;
  if (decoder)  // cross-attention over an encoder output of s positions
    flops +=
        2 * tokens * h * h + 2 * tokens * h * 2 * kv * hd + 4 * tokens * s * h + 2 * tokens * h * h;
  return flops / tp;
}

namespace {

// Ring collectives over n ranks with the link's fit for that collective: 2(n - 1) steps of
// bytes / n each for an all-reduce.
double ring_all_reduce(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * l.step_seconds("all_reduce", bytes / n);
}
// Reduce-scatter ("reduce_scatter") or all-gather ("all_gather") of a buffer of `bytes` (whole,
// before sharding): n - 1 steps of bytes / n.
double ring_half(const char* collective, double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return (n - 1) * l.step_seconds(collective, bytes / n);
}

struct Gemm {
  double m, n, k;  // rows, columns, inner
};

// The projections of one block on one of tp ranks for `tokens` rows (attention's two batched
// products are not GEMM calls in trellis; they are counted apart).
std::vector<Gemm> block_gemms(const ModelConfig& cfg, bool decoder, double tokens, int tp) {
  const double h = cfg.n_embd, kv = cfg.kv_heads() * cfg.head_size(), f = cfg.ffn(), t = tp;
  std::vector<Gemm> g = {{tokens, (h + 2 * kv) / t, h}, {tokens, h, h / t}};
  if (decoder) g.insert(g.end(), {{tokens, h / t, h}, {tokens, 2 * kv / t, h}, {tokens, h, h / t}});
  if (cfg.mlp == MlpKind::Gelu) g.insert(g.end(), {{tokens, f / t, h}, {tokens, h, f / t}});
  if (cfg.mlp == MlpKind::SwiGLU)
    g.insert(g.end(), {{tokens, f / t, h}, {tokens, f / t, h}, {tokens, h, f / t}});
  return g;
}

// Seconds of a forward GEMM (its backward is two of the same size: input and weight gradients).
double gemm_seconds(const Gemm& g, const Machine& machine, const std::string& precision) {
  auto it = machine.gemm.find(precision);
  if (it != machine.gemm.end()) return it->second.seconds(g.m, g.n, g.k);
  return 2 * g.m * g.n * g.k / (machine.peak(precision) * machine.gemm_efficiency);
}

// Seconds of a forward GEMM's backward: its input- and weight-gradient GEMMs.
double gemm_backward_seconds(const Gemm& g, const Machine& machine, const std::string& precision) {
  auto it = machine.gemm_backward.find(precision);
  if (it != machine.gemm_backward.end()) return it->second.seconds(g.m, g.n, g.k);
  return 2 * gemm_seconds(g, machine, precision);
}

struct ChunkCost {
  double fwd_compute = 0, fwd_comm = 0, bwd_compute = 0, bwd_comm = 0, recompute = 0;
  // ... of bwd_compute, the weight-gradient GEMMs and their accumulation (a split backward's
  // Weight op; its Input op is the rest, all of the communication included)
  double weight_compute = 0;
  double gemm_flops_fwd = 0, recompute_flops = 0;
  double fwd() const { return fwd_compute + fwd_comm; }
  double bwd() const { return bwd_compute + bwd_comm; }
  double seconds(Pass pass) const {
    switch (pass) {
      case Pass::Forward:
        return fwd();
      case Pass::Backward:
        return bwd();
      case Pass::Input:
        return bwd() - weight_compute;
      case Pass::Weight:
        return weight_compute;
    }
    return 0;
  }
  double compute(Pass pass) const {
    return pass == Pass::Forward  ? fwd_compute
           : pass == Pass::Input  ? bwd_compute - weight_compute
           : pass == Pass::Weight ? weight_compute
                                  : bwd_compute;
  }
  double comm(Pass pass) const {
    return pass == Pass::Forward ? fwd_comm : pass == Pass::Weight ? 0 : bwd_comm;
  }
};

// Finish time of the last op when every rank runs its op list in order, an op starting once
// its rank is free and its input has arrived: send_s after the op that made it ended, whatever
// the sender does next (each rank's progress thread moves the message while the sender
// computes: docs/parallelism.md, MPI).
double play_schedule(const std::vector<std::vector<PipeOp>>& ops, const std::vector<ChunkCost>& c,
                     int pp, int V, int64_t micro, double send_s) {
  const int G = pp * V;
  std::vector<double> done_f(size_t(micro * G), -1), done_b(size_t(micro * G), -1);
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<double> clock(size_t(pp), 0);
  size_t remaining = 0;
  for (const auto& o : ops) remaining += o.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < pp; ++r) {
      while (next[size_t(r)] < ops[size_t(r)].size()) {
        const PipeOp& op = ops[size_t(r)][next[size_t(r)]];
        const int g = op.chunk * pp + r;
        const size_t at = size_t(op.micro) * size_t(G) + size_t(g);
        double ready = 0;
        if (op.pass == Pass::Weight) {
          // local: after its Input op, earlier in this rank's list
        } else if (op.forward()) {
          if (g > 0) {
            const double d = done_f[at - 1];
            if (d < 0) break;
            ready = d + send_s;
          }
        } else if (g == G - 1) {
          if (done_f[at] < 0) break;
          ready = done_f[at];
        } else {
          const double d = done_b[at + 1];
          if (d < 0) break;
          ready = d + send_s;
        }
        const double start = std::max(clock[size_t(r)], ready);
        clock[size_t(r)] = start + c[size_t(g)].seconds(op.pass);
        if (op.pass != Pass::Weight) (op.forward() ? done_f : done_b)[at] = clock[size_t(r)];
        ++next[size_t(r)];
        --remaining;
        progressed = true;
      }
    }
    TRELLIS_CHECK(progressed, "pipeline schedule deadlocks in the planner's replay");
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace

double pipeline_makespan(ScheduleKind kind, int pp, int micro_batches, int virtual_stages,
                         double fwd_s, double bwd_s, double weight_s) {
  ChunkCost c;
  c.fwd_compute = fwd_s;
  c.bwd_compute = bwd_s;
  c.weight_compute = weight_s;
  const std::vector<ChunkCost> cost(static_cast<size_t>(pp * virtual_stages), c);
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < pp; ++r)
    ops.push_back(build_schedule(kind, pp, r, micro_batches, virtual_stages));
  return play_schedule(ops, cost, pp, virtual_stages, micro_batches, 0);
}

double block_memory_bound_bytes(const ModelConfig& cfg, bool decoder, int64_t b, int64_t s, int tp,
                                bool sequence_parallel) {
  return 6.0 *
         double(block_activation_bytes(cfg, decoder, b, s, tp, sequence_parallel, Recompute::None) -
                block_attention_state_bytes(cfg, decoder, b, s, tp));
}

namespace {

// What every chunk's cost shares: the run, the machine, the kernels' rates and the links.
struct StepSetting {
  const CostInputs& in;
  const Machine& machine;
  const ModelConfig& mc;
  const Layout& L;
  bool megatron;
  int pp, V, G, t;
  double b, s, h;
  double act;             // bytes per activation element on the wire (fp32; Megatron fp16)
  double hbm;             // memory-bound ops' bandwidth
  double attention_rate;  // attention's two batched products
  double stream;          // weights, gradients, optimizer state
  const Link* dp_link;
  const Link* pp_link;
  double tp_coll;  // one of a block's tensor-parallel all-reduces (or its SP pair)
};

StepSetting step_setting(const CostInputs& in, const Machine& machine) {
  const ModelConfig& mc = in.model;
  const Layout& L = in.layout;
  const bool megatron = in.engine == Engine::Megatron;
  const int pp = L.pp, V = L.virtual_stages, t = L.tp, R = in.ranks_per_node;
  TRELLIS_REQUIRE(L.dp >= 1 && t >= 1 && pp >= 1 && V >= 1 && L.micro_batch >= 1 && L.accum >= 1,
                  "layout sizes must be positive");
  const double b = double(L.micro_batch), s = double(in.seq_len), h = mc.n_embd;
  const double act = megatron ? 2 : 4;  // bytes per activation element on the wire
  auto fit = machine.gemm.find(in.precision);
  // The large GEMMs' rate: the calibrated fit's, else the file's peak x efficiency. Attention's
  // products run at it unless the file has trellis's measured attention rate.
  const double gemm_rate = fit != machine.gemm.end()
                               ? fit->second.rate
                               : machine.peak(in.precision) * machine.gemm_efficiency;
  // Memory-bound ops at the measured rate of trellis's own, where calibrated.
  const double hbm = machine.elementwise_bandwidth > 0 && !megatron ? machine.elementwise_bandwidth
                                                                    : machine.memory_bandwidth;
  const double attention_rate =
      machine.attention_flops > 0 && !megatron ? machine.attention_flops : gemm_rate;
  // Mesh order: TP fastest, then DP, then PP; a group is inside a node when its span is.
  const Link& tp_link = (t <= R && R % t == 0) ? machine.intra : machine.inter;
  const Link& dp_link = t * L.dp <= R ? machine.intra : machine.inter;
  const Link& pp_link = t * L.dp * pp <= R ? machine.intra : machine.inter;
  // Each of a block's tensor-parallel all-reduces; sequence parallelism replaces one by an
  // all-gather and a reduce-scatter of the same activation, each at its own calibrated fit.
  const double tp_bytes = b * s * h * act;
  const double tp_coll = L.sequence_parallel ? ring_half("all_gather", tp_bytes, t, tp_link) +
                                                   ring_half("reduce_scatter", tp_bytes, t, tp_link)
                                             : ring_all_reduce(tp_bytes, t, tp_link);
  return {.in = in,
          .machine = machine,
          .mc = mc,
          .L = L,
          .megatron = megatron,
          .pp = pp,
          .V = V,
          .G = pp * V,
          .t = t,
          .b = b,
          .s = s,
          .h = h,
          .act = act,
          .hbm = hbm,
          .attention_rate = attention_rate,
          .stream = machine.memory_bandwidth,
          .dp_link = &dp_link,
          .pp_link = &pp_link,
          .tp_coll = tp_coll};
}

// What the recompute policy runs again in one block's backward: the forward (full) or, selective,
// Megatron's attention core (its T x T softmax) or trellis's MLP up projection(s) (trellis keeps
// the tiled attention's O(T) logsumexp, so its attention is not rerun).
struct RecomputeCost {
  double flops = 0, time = 0, comm = 0;
};

RecomputeCost block_recompute(const StepSetting& x, double fl, double forward_s, int colls) {
  const ModelConfig& mc = x.mc;
  const double b = x.b, s = x.s, h = x.h;
  const int t = x.t;
  RecomputeCost re;
  if (x.L.recompute == Recompute::Full) {
    re.flops = fl;
    re.time = forward_s;
    // trellis reruns the forward's collectives except the MLP's (its result is kept).
    re.comm = (x.megatron || mc.mlp == MlpKind::None ? colls : colls - 1) * x.tp_coll;
  } else if (x.L.recompute == Recompute::Selective && x.megatron) {
    re.flops = 4 * b * s * s * h / t;  // attention's two batched products
    re.time = re.flops / x.attention_rate;
  } else if (x.L.recompute == Recompute::Selective) {
    const int ups = mc.mlp == MlpKind::SwiGLU ? 2 : mc.mlp == MlpKind::Gelu ? 1 : 0;
    re.flops = 2 * ups * b * s * h * mc.ffn() / t;
    for (int i = 0; i < ups; ++i)
      re.time += gemm_seconds({b * s, mc.ffn() / double(t), h}, x.machine, x.in.precision);
  }
  return re;
}

// One block's forward, backward and recomputation, added to its chunk's cost.
void add_block(ChunkCost& c, const StepSetting& x, bool decoder) {
  const ModelConfig& mc = x.mc;
  const Machine& machine = x.machine;
  const std::string& precision = x.in.precision;
  const double b = x.b, s = x.s, h = x.h;
  const int t = x.t;
  const double fl = block_forward_flops(mc, decoder, b, s, t);
  const std::vector<Gemm> gemms = block_gemms(mc, decoder, b * s, t);
  double weights = 0;  // this rank's share of the block's weights
  for (const Gemm& g : gemms) weights += g.n * g.k;
  double gemm_s = 0;
  for (const Gemm& g : gemms) gemm_s += gemm_seconds(g, machine, precision);
  double gemm_bwd_s = 0;
  for (const Gemm& g : gemms) gemm_bwd_s += gemm_backward_seconds(g, machine, precision);
  const double attention_flops = 4 * b * s * s * h / t * (decoder ? 2 : 1);
  const double attention_s = attention_flops / x.attention_rate;
  // Memory-bound ops: the forward writes what the block keeps and reads it once more, the
  // backward reads it and writes gradients of the same size (a third and two thirds of
  // block_memory_bound_bytes; Megatron: of its published activation bytes).
  const double memory_bound_s =
      (x.megatron ? 6 * megatron_activation_per_layer(s, b, h, mc.n_head, t, x.L.sequence_parallel,
                                                      Recompute::None)
                  : block_memory_bound_bytes(mc, decoder, int64_t(b), x.in.seq_len, t,
                                             x.L.sequence_parallel)) /
      x.hbm;
  const int colls = (mc.mlp != MlpKind::None ? 2 : 1) + (decoder ? 1 : 0);
  c.gemm_flops_fwd += fl;
  c.fwd_compute += gemm_s + attention_s + memory_bound_s / 3;
  c.fwd_comm += colls * x.tp_coll;
  // Backward: two GEMMs per forward one; the weight gradients are read and written again
  // (accumulated) per micro-batch.
  c.bwd_compute +=
      gemm_bwd_s + 2 * attention_s + 2 * memory_bound_s / 3 + 2 * weights * 4 / x.stream;
  c.bwd_comm += colls * x.tp_coll;
  // Half the backward GEMMs (the weight-gradient ones) and the gradients' accumulation.
  c.weight_compute += gemm_bwd_s / 2 + 2 * weights * 4 / x.stream;
  const RecomputeCost re = block_recompute(x, fl, gemm_s + attention_s + memory_bound_s / 3, colls);
  c.recompute_flops += re.flops;
  c.recompute += re.time + re.comm;
  c.bwd_compute += re.time;
  c.bwd_comm += re.comm;
}

// The LM head on the last chunk: its GEMM, the logits' softmax and loss, its input gradient's
// tensor-parallel sum.
void add_head(ChunkCost& c, const StepSetting& x) {
  const double b = x.b, s = x.s, h = x.h;
  const int t = x.t;
  const double vocab = x.mc.padded_vocab();
  const double fl = 2 * b * s * h * vocab / t;
  // the logits, softmax and its gradient: fp32, or bf16 in a bf16 run (autocast's head output)
  const double logits = b * s * vocab / t * (x.in.precision == "bf16" ? 2 : 4);
  const Gemm head{b * s, vocab / t, h};
  const double head_s = gemm_seconds(head, x.machine, x.in.precision);
  c.gemm_flops_fwd += fl;
  c.fwd_compute += head_s + 3 * logits / x.hbm;
  c.bwd_compute += gemm_backward_seconds(head, x.machine, x.in.precision) + 3 * logits / x.hbm +
                   2 * vocab / t * h * 4 / x.stream;
  c.weight_compute +=
      gemm_backward_seconds(head, x.machine, x.in.precision) / 2 + 2 * vocab / t * h * 4 / x.stream;
  c.bwd_comm += x.tp_coll;  // the head's input gradient
}

std::vector<ChunkCost> chunk_costs(const StepSetting& x,
                                   const std::vector<std::vector<int>>& chunks) {
  std::vector<ChunkCost> cost(static_cast<size_t>(x.G), ChunkCost{});
  for (int g = 0; g < x.G; ++g) {
    ChunkCost& c = cost[size_t(g)];
    for (int layer : chunks[size_t(g)])
      add_block(c, x, x.mc.encoder_decoder() && layer >= x.mc.n_layer);
    if (g == 0 && x.t > 1) c.fwd_comm += x.tp_coll;  // vocabulary-parallel embedding's sum
    if (g == x.G - 1 && x.mc.lm_head()) add_head(c, x);
  }
  return cost;
}

// The time an activation (or its gradient) takes from one pipeline stage to the next.
double pipeline_send_seconds(const StepSetting& x) {
  if (x.pp == 1) return 0;
  const double bytes = x.b * x.s * x.h * x.act / (x.megatron && x.t > 1 ? x.t : 1);
  return x.pp_link->step_seconds("send_recv", bytes);
}

// The busiest pipeline rank's compute, tensor-parallel communication and recomputation into
// out; returns its busy time.
double take_busiest_rank(StepCost& out, const std::vector<std::vector<PipeOp>>& ops,
                         const std::vector<ChunkCost>& cost, int pp) {
  double busiest = -1;
  for (int r = 0; r < pp; ++r) {
    double compute = 0, comm = 0, recompute = 0;
    for (const PipeOp& op : ops[size_t(r)]) {
      const ChunkCost& c = cost[size_t(op.chunk * pp + r)];
      compute += c.compute(op.pass);
      comm += c.comm(op.pass);
      if (op.pass == Pass::Backward || op.pass == Pass::Input) recompute += c.recompute;
    }
    if (compute + comm > busiest) {
      busiest = compute + comm;
      out.compute_s = compute;
      out.tp_comm_s = comm;
      out.recompute_s = recompute;
    }
  }
  return busiest;
}

// Parameters of the largest pipeline stage on one tensor-parallel rank (stages sync in
// parallel, so the largest sets the data-parallel time).
double largest_stage_floats(const StepSetting& x, const std::vector<std::vector<int>>& chunks) {
  double stage_floats = 0;
  for (int r = 0; r < x.pp; ++r) {
    StageSpec stage;
    stage.embedding = r == 0;
    stage.head = r == x.pp - 1;
    for (int v = 0; v < x.V; ++v)
      stage.layers.insert(stage.layers.end(), chunks[size_t(v * x.pp + r)].begin(),
                          chunks[size_t(v * x.pp + r)].end());
    stage_floats = std::max(stage_floats, double(ParamLayout(x.mc, x.t, 0, &stage).size()));
  }
  return stage_floats;
}

// ZeRO-3's all-gathers of one unit (a block or the root) in a step of m micro-batches over
// `units` units (the root and units - 1 blocks): the root and the first block once after the
// update, then each micro-batch every block before its forward and its backward but the last
// block's backward (kept from its forward) and the first block's forward (kept from the backward
// before, or gathered after the update).
double zero3_unit_gathers(double units, double m) { return 2 + m * std::max(0.0, 2 * (units - 2)); }

// Data-parallel gradient sync of the largest stage (ZeRO's collectives and page refills), what
// of it backward hides, and the optimizer step.
void add_data_parallel_sync(StepCost& out, const StepSetting& x, double stage_floats,
                            const ChunkCost& first_chunk) {
  const Machine& machine = x.machine;
  const Layout& L = x.L;
  const Link& dp_link = *x.dp_link;
  // The gradients' pages (ZeRO-2/3 refill them) are fp32; what crosses the link may be bf16.
  const double grad_bytes = stage_floats * (x.megatron ? 2 : 4);
  const double wire_grad_bytes = x.in.bf16_grad_reduce ? stage_floats * 2 : grad_bytes;
  // bf16 under ZeRO-1/2/3 gathers bf16 working weights (parallel/working_weights.h; the packed
  // fp32 gather of the norms, biases and embeddings beside it is left out).
  const bool bf16_gather = x.in.precision == "bf16" && L.zero >= 1;
  const double param_bytes = stage_floats * (x.megatron || bf16_gather ? 2 : 4);
  const int dp = L.dp;
  const double m = double(L.accum);
  // ZeRO-2/3 reduce (and gather) per unit, a block or the root: each unit's collective pays
  // the latency of two (its even share and the rest elements).
  const double units = x.pp == 1 ? double(x.mc.total_layers()) + 1 : 1;
  const auto per_unit = [&](const char* collective, double bytes) {
    return dp > 1 ? units * ring_half(collective, bytes / units, dp, dp_link) +
                        units * (dp - 1) * dp_link.step_seconds(collective, 4)
                  : 0.0;
  };
  // ZeRO-2/3: one micro-batch's reduce-scatters and one gather of every unit.
  const double scatter = L.zero >= 2 ? per_unit("reduce_scatter", wire_grad_bytes) : 0;
  const double gather = L.zero >= 2 ? per_unit("all_gather", param_bytes) : 0;
  switch (L.zero) {
    case 0:
      out.dp_comm_total_s = ring_all_reduce(wire_grad_bytes, dp, dp_link);
      break;
    case 1:
      out.dp_comm_total_s = ring_half("reduce_scatter", wire_grad_bytes, dp, dp_link) +
                            ring_half("all_gather", param_bytes, dp, dp_link);
      break;
    case 2:  // a reduce-scatter per unit per micro-batch, one gather after the update
      out.dp_comm_total_s = m * scatter + gather;
      break;
    default:  // and each block's parameters gathered before its forward and its backward
      out.dp_comm_total_s = m * scatter + zero3_unit_gathers(units, m) / units * gather;
  }
  // ZeRO-2/3 give pages back after each unit (its gradients every micro-batch; ZeRO-3 also the
  // blocks' parameters after forward and after backward); writing them again faults them in.
  // Within a unit's range whole 2 MiB pages come back with one fault each; its two edges, on
  // average 1 MiB each of a huge page the range shares with a neighbour, were split into 4 KiB
  // pages by the release and fault per 4 KiB.
  if (L.zero >= 2 && machine.page_refill_bandwidth > 0) {
    const double huge_bw = machine.huge_page_refill_bandwidth > 0
                               ? machine.huge_page_refill_bandwidth
                               : machine.page_refill_bandwidth;
    const auto refill = [&](double bytes) {
      const double edges = std::min(bytes, units * double(2 << 20));
      return edges / machine.page_refill_bandwidth + (bytes - edges) / huge_bw;
    };
    // ZeRO-3 keeps each pass's last block for the next pass, so a micro-batch releases all
    // blocks but one after its forward and all but one after its backward.
    const double released_blocks = std::max(0.0, 2 * (units - 2));
    out.page_refill_s = m * (refill(grad_bytes) +
                             (L.zero == 3 ? released_blocks / units * refill(param_bytes) : 0));
  }
  out.dp_comm_s = out.dp_comm_total_s;
  // Inside a node a collective is copies through shared memory, made by the ranks' own cores
  // (each rank's progress thread is bound to its rank's core): they take compute's time rather
  // than hide behind it. Across nodes the time is the wire's, and that hides.
  const bool across_nodes = x.dp_link == &machine.inter;
  if (!x.megatron && x.pp == 1 && dp > 1 && L.zero != 1 && across_nodes) {
    // Each rank's progress thread moves non-blocking collectives while it computes
    // (bench/RESULTS.md, communication that progresses during compute). A pass's collectives
    // start at block boundaries and hide behind the rest of the pass, all but the last unit's
    // share: ZeRO-0's buckets behind the last micro-batch's backward; ZeRO-2's reduce-scatters
    // behind each backward and its gathers, prefetched a block ahead, behind the next forward;
    // ZeRO-3's gathers behind forward and backward too. ZeRO-1 reduces and gathers after
    // backward: nothing to hide behind.
    const double blocks = double(x.mc.total_layers()) + 1;
    const auto exposed = [&](double comm, double pass) {
      return std::max(comm - pass * (blocks - 1) / blocks, comm / blocks);
    };
    const double fwd = first_chunk.fwd(), bwd = first_chunk.bwd();
    // ZeRO-3: the root's and the first block's gathers after the update are waited for as the
    // step starts; each pass gathers the other blocks but one (zero3_unit_gathers).
    const double pass_gathers = std::max(0.0, units - 2) / units * gather;
    out.dp_comm_s = L.zero == 0   ? exposed(out.dp_comm_total_s, bwd)
                    : L.zero == 2 ? m * exposed(scatter, bwd) + exposed(gather, fwd)
                                  : 2 / units * gather + m * (exposed(pass_gathers, fwd) +
                                                              exposed(pass_gathers + scatter, bwd));
  }
  // AdamW reads weights, gradients and two moments and writes three of them: 28 bytes per owned
  // parameter at memory bandwidth.
  const double owned = stage_floats / (L.zero >= 1 ? dp : 1);
  out.optimizer_s = owned * 28 / x.stream;
}

// Model and hardware FLOPs of the step over all ranks, tokens/s, MFU and HFU.
void add_throughput(StepCost& out, const StepSetting& x, const std::vector<ChunkCost>& cost) {
  double fwd_flops = 0, re_flops = 0;
  for (const ChunkCost& c : cost) {
    fwd_flops += c.gemm_flops_fwd;
    re_flops += c.recompute_flops;
  }
  const int dp = x.L.dp;
  const double m = double(x.L.accum);
  // Per-rank FLOPs times the tensor-parallel ranks that share each chunk, per micro-batch.
  const double per_replica = m * x.t;
  out.model_flops = 3 * fwd_flops * per_replica * dp;
  out.hardware_flops = out.model_flops + re_flops * per_replica * dp;
  out.tokens_per_s = double(dp) * m * x.b * x.s / out.step_s;
  const double world_peak = double(x.L.world()) * x.machine.peak(x.in.precision);
  out.mfu = out.model_flops / out.step_s / world_peak;
  out.hfu = out.hardware_flops / out.step_s / world_peak;
}

}  // namespace

StepCost predict_step(const CostInputs& in, const Machine& machine) {
  const StepSetting x = step_setting(in, machine);
  const auto chunks = partition_layers(x.mc.total_layers(), x.G, {});
  const std::vector<ChunkCost> cost = chunk_costs(x, chunks);

  // Every pipeline rank's op list, played with and without the sends' cost.
  std::vector<std::vector<PipeOp>> ops;
  for (int r = 0; r < x.pp; ++r)
    ops.push_back(build_schedule(x.L.schedule, x.pp, r, int(x.L.accum), x.V));
  const double span0 = play_schedule(ops, cost, x.pp, x.V, x.L.accum, 0);
  const double span =
      x.pp > 1 ? play_schedule(ops, cost, x.pp, x.V, x.L.accum, pipeline_send_seconds(x)) : span0;

  StepCost out;
  const double busiest = take_busiest_rank(out, ops, cost, x.pp);
  out.bubble_s = std::max(0.0, span0 - busiest);
  out.pp_comm_s = span - span0;
  add_data_parallel_sync(out, x, largest_stage_floats(x, chunks), cost[0]);
  out.step_s = span + out.dp_comm_s + out.optimizer_s + out.page_refill_s;
  add_throughput(out, x, cost);
  return out;
}

}  // namespace trellis
