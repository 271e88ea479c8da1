// `trellis plan`: every layout of a run on a described machine, with predicted memory and step
// time, the best ones ranked (plan/planner).
#include <fmt/core.h>

#include <cstdio>
#include <sstream>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/model/family.h"
#include "trellis/plan/planner.h"

namespace trellis {

namespace {

struct PlanArgs {
  std::string model, machine, precision = "bf16", grad_reduce_dtype = "fp32";
  int world = 0, ranks_per_node = 0, top = 10;
  int64_t batch = 0, seq_len = 0, vocab = 50257;
  bool json = false, bf16_embeddings = false;
};

// A preset name, or sizes: layers=L,width=H,heads=A[,kv_heads=K][,ffn=F][,arch=gpt2|llama].
ModelConfig parse_model(const std::string& spec, int64_t vocab) {
  ModelConfig base;
  TRELLIS_REQUIRE(vocab >= 1 && vocab <= kMaxVocab, "--vocab {} is out of range", vocab);
  base.vocab_size = int(vocab);
  if (spec.find('=') == std::string::npos) return model_preset(spec, base);
  ModelConfig c = base;
  c.arch = "gpt2";
  std::stringstream ss(spec);
  std::string item;
  std::vector<std::pair<std::string, std::string>> kv;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    TRELLIS_REQUIRE(eq != std::string::npos, "--model: '{}' is not key=value", item);
    kv.push_back({item.substr(0, eq), item.substr(eq + 1)});
    if (kv.back().first == "arch") c.arch = kv.back().second;
  }
  family_of(c.arch).configure(c);
  c.n_layer = 0;
  for (const auto& [k, v] : kv) {
    if (k == "arch") continue;
    long long x = 0;
    try {
      size_t used = 0;
      x = std::stoll(v, &used);
      TRELLIS_REQUIRE(used == v.size(), "--model: {}={} is not an integer", k, v);
    } catch (const std::logic_error&) {
      TRELLIS_REQUIRE(false, "--model: {}={} is not an integer", k, v);
    }
    TRELLIS_REQUIRE(x >= 1 && x <= (1 << 24), "--model: {}={} is out of range", k, v);
    if (k == "layers")
      c.n_layer = int(x);
    else if (k == "width")
      c.n_embd = int(x);
    else if (k == "heads")
      c.n_head = int(x);
    else if (k == "kv_heads")
      c.n_kv_head = int(x);
    else if (k == "ffn")
      c.ffn_hidden = int(x);
    else if (k == "positions")
      c.block_size = int(x);
    else
      TRELLIS_REQUIRE(
          false, "--model: unknown key '{}' (layers, width, heads, kv_heads, ffn, positions, arch)",
          k);
  }
  TRELLIS_REQUIRE(c.n_layer > 0, "--model: layers= is required with sizes");
  c.block_size = std::max(c.block_size, 1);
  c.validate();
  return c;
}

nlohmann::json candidate_json(const Candidate& c) {
  const Layout& l = c.layout;
  nlohmann::json j = {{"layout", l.describe()},
                      {"dp", l.dp},
                      {"tp", l.tp},
                      {"pp", l.pp},
                      {"virtual_stages", l.virtual_stages},
                      {"schedule", schedule_name(l.schedule)},
                      {"zero", l.zero},
                      {"recompute", recompute_name(l.recompute)},
                      {"sequence_parallel", l.sequence_parallel},
                      {"micro_batch", l.micro_batch},
                      {"micro_batches", l.accum},
                      {"fits", c.fits},
                      {"memory",
                       {{"rank", c.memory.rank},
                        {"params", c.memory.params},
                        {"grads", c.memory.grads},
                        {"optimizer", c.memory.optimizer},
                        {"shards", c.memory.shards},
                        {"weight_copies", c.memory.weight_copies},
                        {"model_states", c.memory.model_states()},
                        {"buffers", c.memory.buffers},
                        {"activations", c.memory.activations},
                        {"workspace", c.memory.workspace},
                        {"contexts", c.memory.contexts},
                        {"total", c.memory.total()}}}};
  if (c.fits) {
    const StepCost& s = c.cost;
    j["time"] = {{"step_s", s.step_s},
                 {"compute_s", s.compute_s},
                 {"recompute_s", s.recompute_s},
                 {"tp_comm_s", s.tp_comm_s},
                 {"pp_comm_s", s.pp_comm_s},
                 {"bubble_s", s.bubble_s},
                 {"dp_comm_s", s.dp_comm_s},
                 {"dp_comm_total_s", s.dp_comm_total_s},
                 {"optimizer_s", s.optimizer_s},
                 {"page_refill_s", s.page_refill_s},
                 {"tokens_per_s", s.tokens_per_s},
                 {"mfu", s.mfu},
                 {"hfu", s.hfu},
                 {"model_flops", s.model_flops}};
    j["loses"] = c.loses;
  }
  return j;
}

double gib(int64_t b) { return double(b) / double(int64_t(1) << 30); }

// The plan as a table: the fitting layouts, fastest first (--top of them), or what would fit.
void print_plan(const PlanArgs& a, const PlanRequest& req, const Machine& machine, const Plan& plan,
                double n_params) {
  fmt::print(
      "trellis plan: {:.3g}B parameters, {} ranks ({} per node) of {}, batch {} x {} "
      "tokens, {}\n",
      n_params / 1e9, req.world, req.ranks_per_node, machine.name, req.batch, req.seq_len,
      req.precision);
  fmt::print(
      "{} layouts, {} fit {:.1f} GiB; memory is trellis's own ({}; {}; AdamW state and "
      "activations; as `train --dry-run`)\n",
      plan.candidates.size(), plan.fitting, gib(machine.memory_bytes),
      req.precision == "bf16"
          ? "bf16 working weights with fp32 masters in the ZeRO shards, or fp32 replicas"
          : "fp32 weights",
      // zero.h's bf16_gradient_storage: where a bf16 reduction also stores the gradients.
      req.bf16_grad_reduce
          ? "bf16 gradients under ZeRO-0 without tp and ZeRO-1, on dp > 1 without a pipeline, "
            "fp32 otherwise"
          : "fp32 gradients");
  if (plan.fitting == 0) {
    const Candidate& lean = plan.candidates.front();
    fmt::print("nothing fits: the leanest layout, {}, needs {:.1f} GiB per rank\n",
               lean.layout.describe(), gib(lean.memory.total()));
    if (plan.smallest_world)
      fmt::print("smallest world that fits: {} ranks ({}: {:.1f} GiB per rank)\n",
                 plan.smallest_world, plan.smallest.layout.describe(),
                 gib(plan.smallest.memory.total()));
    else
      fmt::print("no world up to 65536 ranks fits this batch\n");
    return;
  }
  fmt::print("{:>3}  {:<46} {:>9} {:>11} {:>6} {:>8} {:>8} {:>8} {:>8}  {}\n", "#", "layout",
             "step ms", "tokens/s", "MFU", "mem GiB", "bubble", "comm ms", "recomp", "loses by");
  for (int64_t i = 0; i < std::min<int64_t>(a.top, plan.fitting); ++i) {
    const Candidate& c = plan.candidates[size_t(i)];
    const StepCost& s = c.cost;
    fmt::print(
        "{:>3}  {:<46} {:>9.1f} {:>11.0f} {:>5.1f}% {:>8.2f} {:>8.1f} {:>8.1f} "
        "{:>8.1f}  {}\n",
        i + 1, c.layout.describe(), s.step_s * 1e3, s.tokens_per_s, s.mfu * 100,
        gib(c.memory.total()), s.bubble_s * 1e3, (s.tp_comm_s + s.dp_comm_s + s.pp_comm_s) * 1e3,
        s.recompute_s * 1e3, i == 0 ? "(first)" : c.loses);
  }
}

// Request errors (--world, --batch-size, --seq-len, the model) are make_plan's, as for
// --layout auto; only the command's own options are checked here.
int run_plan(const PlanArgs& a) {
  TRELLIS_REQUIRE(a.precision == "fp32" || a.precision == "tf32" || a.precision == "bf16",
                  "--precision must be fp32, tf32 or bf16, not '{}'", a.precision);
  TRELLIS_REQUIRE(a.grad_reduce_dtype == "fp32" || a.grad_reduce_dtype == "bf16",
                  "--grad-reduce-dtype must be fp32 or bf16, not '{}'", a.grad_reduce_dtype);
  TRELLIS_REQUIRE(a.top >= 1, "--top must be positive");
  const Machine machine = load_machine(a.machine);
  machine.peak(a.precision);
  PlanRequest req;
  req.model = parse_model(a.model, a.vocab);
  req.model.bf16_embeddings = a.bf16_embeddings;
  if (req.model.positions != PositionKind::Rope)
    req.model.block_size = std::max<int>(req.model.block_size, int(a.seq_len));
  req.world = a.world;
  req.ranks_per_node = a.ranks_per_node > 0 ? a.ranks_per_node : machine.devices_per_node;
  req.batch = a.batch;
  req.seq_len = a.seq_len;
  req.precision = a.precision;
  req.bf16_grad_reduce = a.grad_reduce_dtype == "bf16";
  const Plan plan = make_plan(req, machine);
  const double n_params = double(ParamLayout(req.model).count());
  if (a.json) {
    nlohmann::json j = {{"machine", machine.name},
                        {"model_params", n_params},
                        {"world", req.world},
                        {"ranks_per_node", req.ranks_per_node},
                        {"batch_size", req.batch},
                        {"seq_len", req.seq_len},
                        {"precision", req.precision},
                        {"grad_reduce_dtype", a.grad_reduce_dtype},
                        {"bf16_embeddings", a.bf16_embeddings},
                        {"device_memory", machine.memory_bytes},
                        {"fitting", plan.fitting},
                        {"layouts", nlohmann::json::array()}};
    for (const Candidate& c : plan.candidates) j["layouts"].push_back(candidate_json(c));
    if (plan.smallest_world) {
      j["smallest_world"] = plan.smallest_world;
      j["smallest_layout"] = candidate_json(plan.smallest);
    }
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  print_plan(a, req, machine, plan, n_params);
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "predict memory and step time of every layout of a run on a described machine "
      "(hardware/*.json) and rank them");
  sub->add_option("--model", a->model,
                  "preset, or sizes: "
                  "layers=L,width=H,heads=A[,kv_heads=K,ffn=F,positions=P,arch=gpt2|llama]")
      ->required();
  sub->add_option("--vocab", a->vocab, "vocabulary size (default GPT-2's 50257)");
  sub->add_option("--world", a->world, "ranks (devices)")->required();
  sub->add_option("--ranks-per-node", a->ranks_per_node,
                  "ranks per node (default: the machine file's devices_per_node)");
  sub->add_option("--batch-size", a->batch, "sequences per step, all data-parallel ranks")
      ->required();
  sub->add_option("--seq-len", a->seq_len, "tokens per sequence")->required();
  sub->add_option("--precision", a->precision, "GEMM precision: fp32 | tf32 | bf16");
  sub->add_option("--grad-reduce-dtype", a->grad_reduce_dtype,
                  "what gradients cross the data-parallel group in: fp32 | bf16 (half the bytes)");
  sub->add_flag("--bf16-embeddings", a->bf16_embeddings,
                "bf16: the model looks its embedding tables up in bf16 (training's "
                "bf16_embeddings), so ZeRO keeps no fp32 copy of them on every rank");
  sub->add_option("--machine", a->machine, "machine description (hardware/*.json)")->required();
  sub->add_option("--top", a->top, "layouts to print (default 10)");
  sub->add_flag("--json", a->json, "every layout, as JSON");
  return {sub, [a](Communicator& world) { return world.rank() == 0 ? run_plan(*a) : 0; }};
}

}  // namespace trellis
