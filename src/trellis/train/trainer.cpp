#include "trellis/train/trainer.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/data/corpus.h"
#include "trellis/data/loader.h"
#include "trellis/io/atomic_file.h"
#include "trellis/io/checkpoint.h"
#include "trellis/kernels/ops.h"
#include "trellis/model/gpt.h"
#include "trellis/parallel/data_parallel.h"
#include "trellis/parallel/mesh.h"
#include "trellis/parallel/pipeline/pipeline.h"
#include "trellis/parallel/tensor_parallel.h"
#include "trellis/train/metrics.h"

namespace trellis {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int default_threads() {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
  const int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
  return std::max(1, hw / ranks_here);
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;
}

// Mean loss over the first `windows` fixed windows of `tokens`, split across DP ranks and run
// forward-only through the pipeline in micro-batches of b.
double evaluate(Pipeline& pipe, int virtual_stages, const std::vector<uint16_t>& tokens,
                int64_t windows, int64_t b, int64_t T, Mesh& mesh) {
  const int64_t lo = windows * mesh.dp_rank() / mesh.dp();
  const int64_t hi = windows * (mesh.dp_rank() + 1) / mesh.dp();
  const int micro = int((hi - lo + b - 1) / b);
  double sum = 0.0;
  if (micro > 0) {
    auto load = [&](int k, Context& ctx) {
      const int64_t first = lo + k * b, rows = std::min(b, hi - first);
      fill_eval_windows(tokens, T, first, rows, ctx.tokens.data(), ctx.targets.data());
      // A short last micro-batch: pad with copies of its first row, whose losses do not count.
      for (int64_t r = rows; r < b; ++r) {
        std::copy_n(ctx.tokens.data(), T, ctx.tokens.data() + r * T);
        std::copy_n(ctx.targets.data(), T, ctx.targets.data() + r * T);
      }
      return rows;
    };
    sum = pipe.run(forward_schedule(micro, virtual_stages), load, 0.0f).loss_sum;
  }
  mesh.pp_comm().all_reduce_sum(&sum, 1);
  mesh.dp_comm().all_reduce_sum(&sum, 1);
  return sum / double(windows * T);
}

// "3,1,2" -> {3, 1, 2}.
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

// Writes the per-rank schedule timelines as a Chrome trace (chrome://tracing, Perfetto).
void write_trace(const std::string& path, Communicator& world, const Mesh& mesh,
                 const std::vector<TraceEvent>& events) {
  // Ranks record different numbers of events: pad to the largest and sum (others add zeros).
  double count = double(events.size());
  world.all_reduce_max(&count, 1);
  const size_t per = size_t(count), fields = 5;
  std::vector<double> all(per * fields * size_t(world.size()), 0.0);
  std::vector<double> coords(size_t(world.size()) * 3, 0.0);
  for (size_t i = 0; i < events.size(); ++i) {
    double* e = all.data() + (size_t(world.rank()) * per + i) * fields;
    e[0] = events[i].start_us, e[1] = events[i].dur_us, e[2] = events[i].micro;
    e[3] = events[i].chunk, e[4] = events[i].forward ? 1.0 : 2.0;
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
      const bool fwd = e[4] == 1.0;
      trace.push_back({{"name", fmt::format("{}{}", fwd ? "F" : "B", int(e[2]))},
                       {"cat", fwd ? "forward" : "backward"},
                       {"ph", "X"},
                       {"pid", 0},
                       {"tid", r},
                       {"ts", e[0]},
                       {"dur", e[1]},
                       {"args", {{"micro_batch", int(e[2])}, {"chunk", int(e[3])}}}});
    }
  }
  write_file_atomic(path, nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump());
}

// Sum of squared gradients in [begin, end) of this rank's buffer, counting parameters that are
// replicated across the tensor-parallel group on its rank 0 only, and the tied embedding on the
// first pipeline stage only (summed over the groups later).
double grad_sum_squares(const ParamLayout& layout, const float* grads, size_t begin, size_t end) {
  double s = 0.0;
  for (const auto& spec : layout.specs()) {
    if (spec.split == TpSplit::None && layout.tp_rank() != 0) continue;
    if (spec.name == "wte.weight" && !layout.stage().embedding) continue;
    const size_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel());
    if (lo < hi) s += ops::sum_squares(grads + lo, int64_t(hi - lo));
  }
  return s;
}

// The global (tp = 1, whole-model layout) tensor values from every tensor-parallel rank's slices
// and every pipeline stage's tensors.
std::vector<float> gather_global(Mesh& mesh, const ModelConfig& mc, const ParamLayout& local,
                                 const float* data) {
  const ParamLayout global(mc);
  std::vector<float> out(global.size(), 0.0f);
  std::vector<float> all(local.size() * size_t(local.tp()));
  if (local.tp() > 1)
    mesh.tp_comm().all_gather_async(data, all.data(), local.size())->wait();
  else
    std::copy_n(data, local.size(), all.begin());
  for (int r = 0; r < local.tp(); ++r)
    scatter_to_global(ParamLayout(mc, local.tp(), r, &local.stage()), global,
                      all.data() + local.size() * size_t(r), out.data());
  if (mesh.pp() > 1) {
    // Each stage filled its own tensors (x + 0 is exact); the last stage's copy of the tied
    // embedding stays out.
    if (!local.stage().embedding) {
      const ParamSpec& wte = global.spec("wte.weight");
      std::fill_n(out.begin() + long(wte.offset), wte.numel(), 0.0f);
    }
    mesh.pp_comm().all_reduce(out.data(), out.size());
  }
  return out;
}

// Full (unsharded) copy of a buffer that each DP rank holds only [shard.begin, shard.end) of.
std::vector<float> gather_shards(Communicator& dp, const std::vector<float>& local,
                                 const ShardRange& sr, size_t n) {
  std::vector<float> mine(sr.shard, 0.0f), all(sr.padded, 0.0f);
  std::copy(local.begin(), local.end(), mine.begin());
  dp.all_gather_async(mine.data(), all.data(), sr.shard)->wait();
  all.resize(n);
  return all;
}

}  // namespace

int run_training(TrainConfig cfg, Communicator& world) {
  const auto run_start = Clock::now();
  Mesh mesh(world, {cfg.dp, cfg.tp, cfg.pp});
  const ScheduleKind schedule = parse_schedule(cfg.schedule);
  const int V = cfg.virtual_stages;
  TRELLIS_REQUIRE(V >= 1, "virtual_stages must be >= 1");
  TRELLIS_REQUIRE(V == 1 || schedule == ScheduleKind::Interleaved,
                  "virtual_stages={} needs --schedule interleaved", V);
  TRELLIS_REQUIRE(cfg.zero == 0 || cfg.zero == 1, "zero must be 0 or 1 (got {})", cfg.zero);
  world.set_timeout(cfg.comm_timeout);
  mesh.dp_comm().set_timeout(cfg.comm_timeout);
  mesh.tp_comm().set_timeout(cfg.comm_timeout);
  mesh.pp_comm().set_timeout(cfg.comm_timeout);
  const bool lead = world.rank() == 0;
  const int threads = cfg.threads > 0 ? cfg.threads : default_threads();
  omp_set_num_threads(threads);

  const Corpus corpus = cfg.data.empty() ? load_default_corpus() : load_corpus_dir(cfg.data);
  const ModelConfig mc = cfg.model_config(corpus.vocab_size);
  const int64_t T = cfg.seq_len > 0 ? cfg.seq_len : mc.block_size;
  TRELLIS_REQUIRE(T <= mc.block_size, "seq_len {} exceeds the model's context length {}", T,
                  mc.block_size);
  TRELLIS_REQUIRE(!cfg.sequence_parallel || T % mesh.tp() == 0,
                  "sequence parallelism needs seq_len {} divisible by tp={}", T, mesh.tp());
  const int dp = mesh.dp();
  const int64_t G = cfg.batch_size;
  TRELLIS_REQUIRE(G >= 1 && G % dp == 0, "batch_size {} is not a positive multiple of dp={}", G,
                  dp);
  const int64_t per_rank = G / dp;
  const int64_t b = cfg.micro_batch_size > 0 ? cfg.micro_batch_size : per_rank;
  TRELLIS_REQUIRE(
      per_rank % b == 0,
      "micro_batch_size {} does not divide the per-rank batch {} (batch_size {} / dp {})", b,
      per_rank, G, dp);
  const int64_t accum = per_rank / b;
  TRELLIS_REQUIRE(cfg.steps >= 0, "steps must be >= 0");
  // Pipeline: pp * V model chunks, chunk g on pipeline rank g % pp. The schedule is built now so
  // that impossible combinations are refused before any work.
  const int pp = mesh.pp(), pp_rank = mesh.pp_rank();
  const auto chunk_layers =
      partition_layers(mc.n_layer, pp * V, parse_layer_split(cfg.layer_split));
  const std::vector<PipeOp> step_ops = build_schedule(schedule, pp, pp_rank, int(accum), V);
  std::vector<StageSpec> chunks;
  StageSpec stage;
  stage.embedding = pp_rank == 0;
  stage.head = pp_rank == pp - 1;
  for (int v = 0; v < V; ++v) {
    const int g = v * pp + pp_rank;
    chunks.push_back({chunk_layers[size_t(g)], g == 0, g == pp * V - 1});
    stage.layers.insert(stage.layers.end(), chunk_layers[size_t(g)].begin(),
                        chunk_layers[size_t(g)].end());
  }

  // This rank's tensor-parallel slices of its pipeline stage.
  const ParamLayout layout(mc, mesh.tp(), mesh.tp_rank(), &stage);
  const ParamLayout global_layout(mc);
  const size_t n = layout.size();
  const ShardRange shard = cfg.zero ? shard_range(n, dp, mesh.dp_rank()) : ShardRange{n, n, 0, n};
  std::vector<float> params(shard.padded, 0.0f), grads(shard.padded, 0.0f);
  Optimizer optimizer(cfg.optim, layout, shard.begin, shard.end);

  int64_t start_step = 0;
  std::string resumed_from;
  if (cfg.resume) {
    resumed_from = find_latest_checkpoint(cfg.out);
    if (resumed_from.empty() && lead && !cfg.quiet)
      fmt::print("trellis: --resume: no checkpoint in {} yet, starting from step 0\n", cfg.out);
  }
  if (!resumed_from.empty()) {
    CheckpointData ck = load_checkpoint(resumed_from, true);
    TRELLIS_REQUIRE(ck.model.n_layer == mc.n_layer && ck.model.n_embd == mc.n_embd &&
                        ck.model.n_head == mc.n_head && ck.model.block_size == mc.block_size &&
                        ck.model.vocab_size == mc.vocab_size,
                    "{}: checkpoint model shape differs from the configured model", resumed_from);
    const ParamLayout saved(ck.model);
    copy_from_global(layout, saved, ck.params.data(), params.data());
    std::vector<float> local(n);
    for (auto& [name, buf] : optimizer.state()) {
      auto it = std::find_if(ck.optimizer.buffers.begin(), ck.optimizer.buffers.end(),
                             [&](const auto& p) { return p.first == name; });
      TRELLIS_REQUIRE(it != ck.optimizer.buffers.end(),
                      "{}: optimizer.safetensors has no '{}' state (optimizer changed?)",
                      resumed_from, name);
      copy_from_global(layout, saved, it->second.data(), local.data());
      std::copy(local.begin() + long(shard.begin), local.begin() + long(shard.end), buf->begin());
    }
    start_step = ck.state.at("step").get<int64_t>();
  } else {
    init_params(layout, cfg.seed, params.data());
  }
  // Every DP replica must start from identical weights (they are generated, never broadcast).
  {
    double sums[2] = {0.0, 0.0};
    for (size_t i = 0; i < n; ++i) sums[0] += double(params[i]) * double((i % 7919) + 1);
    sums[1] = -sums[0];
    mesh.dp_comm().all_reduce_max(sums, 2);
    TRELLIS_CHECK(sums[0] == -sums[1], "ranks start from different weights (checksum {} vs {})",
                  sums[0], -sums[1]);
  }

  TensorParallel tp(&mesh.tp_comm(), cfg.sequence_parallel);
  std::vector<std::unique_ptr<GPT>> models;
  std::vector<GPT*> model_chunks;
  for (const StageSpec& c : chunks) {
    models.push_back(std::make_unique<GPT>(mc, layout, params.data(), grads.data(), tp, &c));
    model_chunks.push_back(models.back().get());
  }
  Pipeline pipe(mesh.pp_comm(), model_chunks, b, T, mc.n_embd);
  // The tied embedding lives on the first and the last stage: their gradients are summed.
  std::unique_ptr<Communicator> tied;  // first + last stage (middle stages form an unused group)
  if (pp > 1) {
    tied = mesh.pp_comm().split(stage.embedding || stage.head ? 0 : 1, pp_rank);
    tied->set_timeout(cfg.comm_timeout);
  }
  BatchLoader loader(corpus.train, T, G, cfg.seed, cfg.shuffle);
  std::unique_ptr<GradReducer> reducer;
  if (dp > 1 && cfg.zero == 0)
    reducer = std::make_unique<GradReducer>(mesh.dp_comm(), grads.data(), n,
                                            size_t(cfg.bucket_mb * 1024 * 1024));
  std::vector<float> grad_shard(cfg.zero ? shard.shard : 0);

  const int64_t val_windows = std::min<int64_t>(
      cfg.val_batches * G, corpus.val.size() > 1 ? (int64_t(corpus.val.size()) - 1) / T : 0);
  std::unique_ptr<MetricsLog> log;
  if (lead)
    log = std::make_unique<MetricsLog>(cfg.out, cfg.tensorboard,
                                       resumed_from.empty() ? -1 : start_step);
  const int64_t n_params = global_layout.count();
  const double step_flops = flops_per_token(mc, n_params, T) * double(G * T);
  const double peak_flops = cfg.peak_gflops_per_core * 1e9 * threads * world.size();
  const int64_t mem_bytes =
      int64_t((params.size() + grads.size()) * sizeof(float) + optimizer.state_bytes());
  if (lead && !cfg.quiet) {
    fmt::print(
        "trellis: {} | {} layers, {} heads, width {}, context {}, vocab {} ({} padded) | "
        "{:.2f}M parameters\n",
        cfg.model, mc.n_layer, mc.n_head, mc.n_embd, mc.block_size, mc.vocab_size,
        mc.padded_vocab(), double(n_params) / 1e6);
    fmt::print("trellis: data {} | {} train / {} val tokens | {} windows of {}\n", corpus.source,
               corpus.train.size(), corpus.val.size(), loader.windows(), T);
    fmt::print(
        "trellis: world {} (dp {}, tp {}{}, pp {}{}, zero {}) | {} threads/rank | batch {} "
        "x {} tokens = {} per rank x {} micro-batches of {}{}\n",
        world.size(), dp, mesh.tp(), tp.sequence_parallel() ? " + sequence parallel" : "", pp,
        pp > 1 ? fmt::format(" {}{}", schedule_name(schedule), V > 1 ? fmt::format(" x{}", V) : "")
               : "",
        cfg.zero, threads, G, T, per_rank, accum, b,
        resumed_from.empty() ? "" : " | resumed from " + resumed_from);
    std::fflush(stdout);
  }

  auto checkpoint = [&](int64_t step) {
    CheckpointData ck;
    ck.model = mc;
    ck.tokenizer = {corpus.tokenizer, corpus.tokenizer_dir};
    ck.params = gather_global(mesh, mc, layout, params.data());
    for (auto& [name, buf] : optimizer.state()) {
      const std::vector<float> local =
          cfg.zero ? gather_shards(mesh.dp_comm(), *buf, shard, n) : *buf;
      ck.optimizer.buffers.emplace_back(name, gather_global(mesh, mc, layout, local.data()));
    }
    nlohmann::json conf;
    auto keys = config_keys(cfg);
    for (auto& k : keys) conf[k.name] = k.get();
    ck.state = {{"step", step},
                {"tokens_seen", step * G * T},
                {"data",
                 {{"next_step", step},
                  {"global_batch", G},
                  {"seq_len", T},
                  {"shuffle", cfg.shuffle},
                  {"seed", cfg.seed}}},
                {"rng", {{"kind", "philox4x32-10"}, {"seed", cfg.seed}}},
                {"config", conf}};
    std::string path;
    if (lead) path = save_checkpoint(cfg.out, step, ck);
    world.barrier();
    return path;
  };

  double best_val = INFINITY, tokens_per_s_sum = 0.0, mfu_sum = 0.0;
  int64_t timed_steps = 0;
  std::string last_checkpoint;
  std::vector<TraceEvent> trace;
  world.barrier();  // a common time origin for the trace
  pipe.record_trace(!cfg.trace.empty());
  const auto loop_start = Clock::now();
  for (int64_t step = start_step + 1; step <= cfg.steps; ++step) {
    const auto t0 = Clock::now();
    ops::zero(grads.data(), int64_t(grads.size()));
    const float grad_scale = 1.0f / float(G * T);
    auto load = [&](int k, Context& ctx) {
      loader.fill(step - 1, mesh.dp_rank() * per_rank + k * b, b, ctx.tokens.data(),
                  ctx.targets.data());
      return b;
    };
    // Without a pipeline, buckets are all-reduced while backward still runs (chunks finish in
    // layout order); with one, after the schedule.
    std::function<void(int)> on_block_done;
    if (reducer && pp == 1)
      on_block_done = [&](int l) { reducer->ready_from(l >= 0 ? layout.block_offset(l) : 0); };
    const PipelineStats ps = pipe.run(step_ops, load, grad_scale, on_block_done);
    if (cfg.trace.empty() == false && step - start_step == cfg.trace_steps) {
      write_trace(cfg.trace, world, mesh, pipe.trace());
      pipe.record_trace(false);
    }
    double loss_sum = ps.loss_sum;
    if (tied && (stage.embedding || stage.head)) {
      const ParamSpec& wte = layout.spec("wte.weight");
      tied->all_reduce(grads.data() + wte.offset, wte.numel());
    }
    double comm_exposed = 0.0;
    if (reducer) {
      if (pp > 1) reducer->ready_from(0);
      reducer->finish();
      comm_exposed = reducer->exposed_seconds();
    } else if (cfg.zero && dp > 1) {
      const auto tc = Clock::now();
      mesh.dp_comm().reduce_scatter_async(grads.data(), grad_shard.data(), shard.shard)->wait();
      std::copy_n(grad_shard.data(), shard.end - shard.begin, grads.data() + shard.begin);
      comm_exposed = seconds_since(tc);
    }
    double norm_sq = grad_sum_squares(layout, grads.data(), shard.begin, shard.end);
    if (mesh.tp() > 1) mesh.tp_comm().all_reduce_sum(&norm_sq, 1);
    // The loss is known on the last stage only; the norm sums over the stages.
    double pp_stats[3] = {loss_sum, norm_sq, 1.0 - ps.compute_s / ps.total_s};
    double peak_micro = ps.peak_contexts;  // activations alive at once, largest stage
    if (pp > 1) {
      mesh.pp_comm().all_reduce_sum(pp_stats, 3);
      mesh.pp_comm().all_reduce_max(&peak_micro, 1);
    }
    loss_sum = pp_stats[0];
    norm_sq = pp_stats[1];
    const double bubble = pp > 1 ? pp_stats[2] / pp : 0.0;
    double stats[2] = {loss_sum, cfg.zero ? norm_sq : 0.0};
    mesh.dp_comm().all_reduce_sum(stats, 2);
    if (cfg.zero) norm_sq = stats[1];
    const double loss = stats[0] / double(G * T);
    const double grad_norm = std::sqrt(norm_sq);
    // Clipping rides along the optimizer's sweep instead of a pass of its own.
    const float grad_mul = cfg.optim.grad_clip > 0.0f && grad_norm > cfg.optim.grad_clip
                               ? float(cfg.optim.grad_clip / (grad_norm + 1e-6))
                               : 1.0f;
    const float lr = learning_rate(cfg.optim, step, cfg.steps);
    optimizer.step(params.data(), grads.data(), lr, step, grad_mul);
    if (cfg.zero && dp > 1) {
      const auto tc = Clock::now();
      std::copy_n(params.data() + shard.begin, shard.end - shard.begin, grad_shard.data());
      mesh.dp_comm().all_gather_async(grad_shard.data(), params.data(), shard.shard)->wait();
      comm_exposed += seconds_since(tc);
    }
    const double dt = seconds_since(t0);
    const double tp_comm = tp.take_comm_seconds();
    // Memory of the largest rank (ZeRO and TP make ranks differ).
    double mem[2] = {double(mem_bytes), double(peak_rss_bytes())};
    world.all_reduce_max(mem, 2);
    const double tokens_per_s = double(G * T) / dt;
    const double mfu = step_flops / dt / peak_flops;
    if (step > start_step + 1 || cfg.steps == start_step + 1) {
      tokens_per_s_sum += tokens_per_s;
      mfu_sum += mfu;
      ++timed_steps;
    }
    if (lead) {
      log->write({{"step", step},
                  {"loss", loss},
                  {"lr", lr},
                  {"grad_norm", grad_norm},
                  {"tokens_per_s", tokens_per_s},
                  {"mfu", mfu},
                  {"step_ms", dt * 1e3},
                  {"compute_ms", (dt - comm_exposed - tp_comm) * 1e3},
                  {"comm_exposed_ms", comm_exposed * 1e3},
                  {"tp_comm_ms", tp_comm * 1e3},
                  {"mem_bytes", mem_bytes},
                  {"mem_bytes_max", mem[0]},
                  {"peak_rss_bytes", peak_rss_bytes()},
                  {"peak_rss_bytes_max", mem[1]},
                  {"bubble", bubble},
                  {"bubble_theory", theoretical_bubble(pp, int(accum), V)},
                  {"peak_micro_batches", peak_micro}},
                 "train");
      if (!cfg.quiet && (step % std::max<int64_t>(1, cfg.log_every) == 0 || step == cfg.steps)) {
        const double eta =
            seconds_since(loop_start) / double(step - start_step) * double(cfg.steps - step);
        fmt::print(
            "step {:>{}}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} ms | "
            "{:.0f} tok/s | MFU {:.1f}% | ETA {}\n",
            step, std::to_string(cfg.steps).size(), cfg.steps, loss, lr, grad_norm, dt * 1e3,
            tokens_per_s, mfu * 100.0, format_duration(eta));
        std::fflush(stdout);
      }
    }
    const bool stopping = step == cfg.stop_at;
    const bool last = step == cfg.steps;
    if (val_windows > 0 && ((cfg.val_every > 0 && step % cfg.val_every == 0) || last)) {
      const double val = evaluate(pipe, V, corpus.val, val_windows, b, T, mesh);
      best_val = std::min(best_val, val);
      if (lead) {
        log->write({{"step", step}, {"val_loss", val}}, "val");
        if (!cfg.quiet) fmt::print("step {} | val loss {:.4f}\n", step, val);
      }
    }
    if ((cfg.save_every > 0 && step % cfg.save_every == 0) || last || stopping)
      last_checkpoint = checkpoint(step);
    if (stopping) break;
  }
  if (cfg.steps <= start_step) last_checkpoint = checkpoint(start_step);
  const int64_t end_step = cfg.stop_at > start_step ? std::min(cfg.stop_at, cfg.steps) : cfg.steps;

  if (lead && !cfg.quiet) {
    const int64_t trained = end_step - start_step;
    fmt::print(
        "trellis: done | {} steps, {} tokens in {} | mean {:.0f} tok/s, MFU {:.1f}%{} | "
        "checkpoint {} | metrics {}/metrics.jsonl{}\n",
        std::max<int64_t>(0, trained), std::max<int64_t>(0, trained) * G * T,
        format_duration(seconds_since(run_start)),
        timed_steps ? tokens_per_s_sum / double(timed_steps) : 0.0,
        timed_steps ? 100.0 * mfu_sum / double(timed_steps) : 0.0,
        std::isfinite(best_val) ? fmt::format(" | best val loss {:.4f}", best_val) : "",
        last_checkpoint.empty() ? "(none)" : last_checkpoint, cfg.out,
        cfg.tensorboard ? fmt::format(" | tensorboard --logdir {}/tb", cfg.out) : "");
  }
  return 0;
}

}  // namespace trellis
