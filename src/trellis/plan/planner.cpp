#include "trellis/plan/planner.h"

#include <fmt/core.h>

#include <algorithm>

#include "trellis/core/error.h"

namespace trellis {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

RunShape run_shape(const PlanRequest& req, const Layout& l) {
  RunShape r;
  r.model = req.model;
  r.dp = l.dp;
  r.tp = l.tp;
  r.pp = l.pp;
  r.virtual_stages = l.virtual_stages;
  r.zero = l.zero;
  r.sequence_parallel = l.sequence_parallel;
  r.recompute = l.recompute;
  r.schedule = l.schedule;
  r.micro_batch = l.micro_batch;
  r.seq_len = req.seq_len;
  r.accum = l.accum;
  r.optimizer = req.optimizer;
  r.compute = req.precision == "bf16" ? DType::BF16 : DType::F32;
  r.grad_dtype = req.bf16_grad_reduce ? GradReduceDtype::Bf16 : GradReduceDtype::Fp32;
  return r;
}

// The (tp, pp, dp) meshes of `world` the model allows: tp divides the heads (and key/value
// heads), pp divides the blocks, dp divides the batch.
struct Mesh {
  int tp, pp, dp;
};
std::vector<Mesh> meshes(const ModelConfig& m, int world, int64_t batch) {
  std::vector<Mesh> out;
  for (int64_t tp : divisors(world)) {
    if (m.n_head % tp != 0 || m.kv_heads() % tp != 0 || m.ffn() % tp != 0) continue;
    for (int64_t pp : divisors(world / tp)) {
      if (m.total_layers() % pp != 0) continue;
      const int64_t dp = world / tp / pp;
      if (batch % dp != 0) continue;
      out.push_back({int(tp), int(pp), int(dp)});
    }
  }
  return out;
}

}  // namespace

namespace {
// False for a layout the trainer refuses (check_run_shape, e.g. sequence parallelism with seq_len
// not divisible by tp) or the model's split does (e.g. a vocabulary tp does not divide).
bool try_memory(const PlanRequest& req, const Layout& l, RankMemory& out) {
  try {
    out = layout_memory(req, l);
    return true;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Input) throw;
    return false;
  }
}
}  // namespace

std::vector<Layout> enumerate_layouts(const ModelConfig& model, int world, int64_t batch) {
  std::vector<Layout> out;
  const Recompute policies[] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (const Mesh& mesh : meshes(model, world, batch)) {
    const int64_t per_rank = batch / mesh.dp;
    for (int64_t mb : divisors(per_rank)) {
      const int64_t accum = per_rank / mb;
      // (schedule, virtual stages): one pipeline-free schedule when pp = 1.
      std::vector<std::pair<ScheduleKind, int>> schedules;
      if (mesh.pp == 1) {
        schedules.push_back({ScheduleKind::OneFOneB, 1});
      } else {
        schedules.push_back({ScheduleKind::GPipe, 1});
        schedules.push_back({ScheduleKind::OneFOneB, 1});
        schedules.push_back({ScheduleKind::ZeroBubble, 1});
        if (accum % mesh.pp == 0)
          for (int v = 2; v <= model.total_layers() / mesh.pp; ++v)
            if (model.total_layers() % (mesh.pp * v) == 0)
              schedules.push_back({ScheduleKind::Interleaved, v});
      }
      // ZeRO-2/3 refuse a pipeline; ZeRO needs data-parallel ranks to shard over.
      const int max_zero = mesh.dp == 1 ? 0 : mesh.pp > 1 ? 1 : 3;
      for (const auto& [kind, v] : schedules)
        for (int zero = 0; zero <= max_zero; ++zero)
          for (Recompute rc : policies)
            for (int sp = 0; sp <= (mesh.tp > 1 ? 1 : 0); ++sp) {
              Layout l;
              l.dp = mesh.dp;
              l.tp = mesh.tp;
              l.pp = mesh.pp;
              l.virtual_stages = v;
              l.schedule = kind;
              l.zero = zero;
              l.recompute = rc;
              l.sequence_parallel = sp == 1;
              l.micro_batch = mb;
              l.accum = accum;
              // zb1's weight part reads the kept activations: no recompute (check_run_shape).
              if (kind != ScheduleKind::ZeroBubble || rc == Recompute::None) out.push_back(l);
            }
    }
  }
  return out;
}

RankMemory layout_memory(const PlanRequest& req, const Layout& layout) {
  const RunShape run = run_shape(req, layout);
  check_run_shape(run);
  RankMemory worst;
  bool first = true;
  for (int r = 0; r < layout.pp; ++r) {
    const RankMemory m = predict_rank_memory(run, r, 0, 0);
    if (first || m.total() > worst.total()) worst = m;
    first = false;
  }
  return worst;
}

std::string why_slower(const Candidate& c, const Candidate& best) {
  const StepCost &a = c.cost, &b = best.cost;
  if (a.step_s <= b.step_s * 1.001) {
    const int64_t more = c.memory.total() - best.memory.total();
    return more > 0 ? fmt::format("ties; needs {:.2f} GiB more memory", double(more) / (1 << 30))
                    : "ties";
  }
  struct Term {
    const char* what;
    double delta;
  };
  const Term terms[] = {
      {"recompute cost", a.recompute_s - b.recompute_s},
      {"compute", (a.compute_s - a.recompute_s) - (b.compute_s - b.recompute_s)},
      {"bubble", a.bubble_s - b.bubble_s},
      {"exposed tensor-parallel comm", a.tp_comm_s - b.tp_comm_s},
      {"exposed data-parallel comm", a.dp_comm_s - b.dp_comm_s},
      {"pipeline sends", a.pp_comm_s - b.pp_comm_s},
      {"optimizer", a.optimizer_s - b.optimizer_s},
      {"page refills (ZeRO-2/3)", a.page_refill_s - b.page_refill_s},
  };
  const Term* worst = &terms[0];
  for (const Term& t : terms)
    if (t.delta > worst->delta) worst = &t;
  return fmt::format("{} +{:.1f} ms", worst->what, worst->delta * 1e3);
}

Plan make_plan(const PlanRequest& req, const Machine& machine) {
  TRELLIS_REQUIRE(req.world >= 1 && req.world <= 65536, "--world must be in [1, 65536]");
  TRELLIS_REQUIRE(req.ranks_per_node >= 1, "--ranks-per-node must be positive");
  TRELLIS_REQUIRE(req.batch >= 1 && req.seq_len >= 1,
                  "--batch-size and --seq-len must be positive");
  TRELLIS_REQUIRE(req.seq_len <= req.model.block_size || req.model.positions == PositionKind::Rope,
                  "--seq-len {} is longer than the model's {} positions", req.seq_len,
                  req.model.block_size);
  Plan plan;
  for (const Layout& l : enumerate_layouts(req.model, req.world, req.batch)) {
    Candidate c;
    c.layout = l;
    if (!try_memory(req, l, c.memory)) continue;
    c.fits = c.memory.total() <= machine.memory_bytes;
    if (c.fits) {
      CostInputs in{req.model,     l,
                    req.seq_len,   req.ranks_per_node,
                    req.precision, Engine::Trellis,
                    req.bf16_grad_reduce};
      c.cost = predict_step(in, machine);
      ++plan.fitting;
    }
    plan.candidates.push_back(std::move(c));
  }
  TRELLIS_REQUIRE(!plan.candidates.empty(),
                  "no layout of {} ranks exists for this model and batch: tp must divide the {} "
                  "heads, pp the {} blocks and dp the batch of {}",
                  req.world, req.model.n_head, req.model.total_layers(), req.batch);
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.fits != b.fits) return a.fits;
                     if (!a.fits) return a.memory.total() < b.memory.total();
                     if (a.cost.tokens_per_s != b.cost.tokens_per_s)
                       return a.cost.tokens_per_s > b.cost.tokens_per_s;
                     return a.memory.total() < b.memory.total();
                   });
  if (plan.fitting > 0) {
    for (int64_t i = 1; i < plan.fitting; ++i)
      plan.candidates[size_t(i)].loses = why_slower(plan.candidates[size_t(i)], plan.candidates[0]);
    return plan;
  }
  // Nothing fits: the smallest larger world with a layout that does, trying per mesh its
  // leanest settings (one sequence per micro-batch, full recompute, the highest ZeRO stage,
  // sequence parallelism, 1F1B).
  std::vector<int> worlds;
  for (int w = req.world + 1; w <= std::min(req.ranks_per_node, 65536); ++w) worlds.push_back(w);
  for (int64_t w = (int64_t(req.world) / req.ranks_per_node + 1) * req.ranks_per_node; w <= 65536;
       w += req.ranks_per_node)
    if (w > req.world && w > req.ranks_per_node) worlds.push_back(int(w));
  for (int w : worlds) {
    for (const Mesh& mesh : meshes(req.model, w, req.batch)) {
      Layout l;
      l.dp = mesh.dp;
      l.tp = mesh.tp;
      l.pp = mesh.pp;
      l.zero = mesh.dp == 1 ? 0 : mesh.pp > 1 ? 1 : 3;
      l.recompute = Recompute::Full;
      l.sequence_parallel = mesh.tp > 1;
      l.micro_batch = 1;
      l.accum = req.batch / mesh.dp;
      Candidate c;
      c.layout = l;
      if (!try_memory(req, l, c.memory)) continue;
      if (c.memory.total() <= machine.memory_bytes &&
          (!plan.smallest_world || c.memory.total() < plan.smallest.memory.total())) {
        c.fits = true;
        plan.smallest_world = w;
        plan.smallest = c;
      }
    }
    if (plan.smallest_world) break;
  }
  return plan;
}

}  // namespace trellis
