#include "trellis/train/trainer.h"

#include <fmt/ranges.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "trellis/comm/communicator.h"
#include "trellis/core/atomic_file.h"
#include "trellis/core/clock.h"
#include "trellis/core/error.h"
#include "trellis/core/memory.h"
#include "trellis/core/threads.h"
#include "trellis/data/corpus.h"
#include "trellis/data/mixture.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/data/subword.h"
#include "trellis/eval/classification.h"
#include "trellis/io/checkpoint.h"
#include "trellis/io/pretrained.h"
#include "trellis/kernels/isa.h"
#include "trellis/kernels/ops.h"
#include "trellis/kernels/peak.h"
#include "trellis/model/family.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/global_view.h"
#include "trellis/parallel/mesh.h"
#include "trellis/parallel/pipeline/pipeline.h"
#include "trellis/parallel/replicated_grads.h"
#include "trellis/parallel/tied.h"
#include "trellis/parallel/zero.h"
#include "trellis/plan/memory_plan.h"
#include "trellis/tensor_parallel/operators.h"
#include "trellis/train/auto_layout.h"
#include "trellis/train/batches.h"
#include "trellis/train/best.h"
#include "trellis/train/checkpointing.h"
#include "trellis/train/fault.h"
#include "trellis/train/metrics.h"
#include "trellis/train/run_data.h"
#include "trellis/train/stop_signal.h"
#include "trellis/train/time_budget.h"
#include "trellis/train/trace.h"
#include "trellis/train/validate_run.h"

namespace trellis {

namespace {

// This process's own high-water mark (VmHWM). getrusage's ru_maxrss is not: after a vfork+exec
// (Python's subprocess, posix_spawn) it starts from the parent's peak.
int64_t peak_rss_bytes() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) return int64_t(kb) * 1024;
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;
}

// Sum of squared gradients of the owned ranges (compact: fp32 values, or bf16 bits when bits is
// not null), counting parameters that are replicated across the tensor-parallel group on its rank
// 0 only, and tied tensors on their owning stage only (summed over the groups later).
double grad_sum_squares(const ParamLayout& layout, const std::vector<FlatRange>& owned,
                        const float* grads, const uint16_t* bits) {
  double s = 0.0;
  size_t at = 0;  // compact offset of the range
  for (const FlatRange& r : owned) {
    for (const auto& spec : layout.specs()) {
      if (spec.split_dim < 0 && layout.tp_rank() != 0) continue;
      if (spec.tied_copy) continue;
      const size_t lo = std::max(r.begin, spec.offset),
                   hi = std::min(r.end, spec.offset + spec.numel());
      if (lo >= hi) continue;
      const size_t first = at + (lo - r.begin), n = hi - lo;
      if (!bits) {
        s += ops::sum_squares(grads + first, int64_t(n));
        continue;
      }
      float widened[4096];
      for (size_t k = 0; k < n; k += std::size(widened)) {
        const size_t len = std::min(std::size(widened), n - k);
        ops::from_bf16(widened, bits + first + k, int64_t(len));
        s += ops::sum_squares(widened, int64_t(len));
      }
    }
    at += r.size();
  }
  return s;
}

// A validation pass: the mean loss and, for a classifier, its confusion matrix.
struct EvalResult {
  double loss = 0.0;
  int64_t items = 0;
  ConfusionMatrix confusion;
  std::vector<std::pair<std::string, double>> per_set;  // a mixture's datasets' losses
};

// What one training step measured, for the metrics and the progress line.
struct StepStats {
  double loss = 0.0, grad_norm = 0.0, lr = 0.0, seconds = 0.0;
  double comm_exposed = 0.0, tp_comm = 0.0, bubble = 0.0, peak_micro = 0.0;
  double start = 0.0;  // seconds from the process's start to the step's start
};

// One rank's part of a training run: the model chunks of its pipeline stage (its tensor-parallel
// slices), the optimizer over its data-parallel shard, and the strategies that tie them together.
// Each step is forward_backward_step, then optimizer_step; evaluate and save run between steps.
class Trainer {
 public:
  // data and shape: load_run_data and validate_run of cfg on this world.
  Trainer(TrainConfig cfg, Communicator& world, RunData data, const RunShape& shape);
  int run();

 private:
  // The constructor's steps, in order.
  // The data (token corpus or task examples), the model config and T it implies, and the
  // shape's numbers kept at hand.
  void take_run(RunData data);
  // The keys that are not the run's shape, checked before any work.
  void check_other_keys() const;
  // Communication timeouts, OpenMP threads, and the GEMM precision every rank can run.
  void set_up_rank();
  // This rank's pipeline chunks, its parameter layout, the data-parallel strategy and the
  // optimizer.
  void build_layout_and_strategies();
  void build_pipeline_chunks();
  void check_memory_plan() const;
  void load_or_init();
  void check_replicas_agree();
  void set_up_checkpointing();
  // The model chunks over the flat buffers, the pipeline that runs them and the tied weights.
  void build_chunks();
  void set_up_batches_and_logging();
  // The FLOPs of a step and the peak MFU divides them by.
  void set_up_mfu();
  void print_header() const;
  // Forward and backward of every micro-batch of the global batch step, gradients summed over
  // the whole mesh. Returns the loss on every rank.
  StepStats forward_backward_step(int64_t step);
  // Clip, update, and share the updated parameters.
  void optimizer_step(int64_t step, StepStats& st);
  // The fp32 weights may have changed since the chunks' last pass: their bf16 copies are stale.
  void weights_changed();
  EvalResult evaluate();
  EvalResult evaluate_set(int64_t items);
  int64_t val_items_of(int set);
  void log_validation(int64_t step, const EvalResult& r);
  void print_confusion(const ConfusionMatrix& m) const;
  // name: empty = OUT/step_NNNNNNNN; "best" = OUT/best (keep_best).
  std::string save(int64_t step, const std::string& name = "");
  // After a validation: keep_best's metric (rank 0's value on every rank), OUT/best when it
  // improved, and whether early stopping ends the run here.
  bool track_best(int64_t step, const EvalResult& val);
  // What this rank writes into a checkpoint: its owned ranges (ZeRO), or its 1/dp of a replica.
  OwnedArrays owned_state();
  void log_step(int64_t step, const StepStats& st);
  void fit_time_budget(int64_t step, double step_seconds);

  TrainConfig cfg_;
  Communicator& world_;
  RunShape shape_;  // validated; compute is the precision all ranks agreed on
  Mesh mesh_;
  bool lead_;
  int threads_;
  DType compute_ = DType::F32;  // the GEMM precision
  // TRELLIS_TEST_DROPOUT_PLANT=1 (tests only): each rank mixes its world rank into the dropout
  // seed, a layout-dependent mask the layout-equivalence tests must catch. 0 otherwise.
  uint64_t dropout_plant_ = 0;
  Mixture lm_data_;                 // the language model's data (one corpus or a mixture)
  std::unique_ptr<TaskData> task_;  // or a task's
  Augment augment_;                 // of a task's training images
  BestTracker best_;                // keep_best, early_stop_patience
  nlohmann::json resumed_best_;     // the tracker's state in the checkpoint resumed from
  TokenizerInfo tokenizer_;
  std::unique_ptr<SubwordNgrams> subword_;  // subword_ngrams > 0: the models' n-gram bags
  ModelConfig mc_;
  int64_t T_, G_, per_rank_;  // shape_.seq_len, the global batch, its share per dp rank
  std::vector<PipeOp> step_ops_;
  StageSpec stage_;
  std::vector<StageSpec> chunks_;
  std::unique_ptr<ParamLayout> layout_;
  size_t n_ = 0;
  std::unique_ptr<DataParallelSync> dp_sync_;  // holds the parameter and gradient buffers
  bool params_compact_ = false;  // loaded as the owned pieces only (ZeRO-2/3 resume)
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<TiedWeights> tied_;
  std::vector<std::unique_ptr<ModelChunk>> models_;
  std::unique_ptr<Pipeline> pipe_;
  std::unique_ptr<Batches> batches_;
  std::unique_ptr<MetricsLog> log_;
  std::unique_ptr<Checkpointer> checkpointer_;
  int64_t start_step_ = 0;
  std::string resumed_from_;
  int64_t val_items_ = 0;
  // time_budget: the last step the budget allows, once decided (0 = not yet); the most the run
  // trains; the step of the first decision and the step from which the next one is due (0 =
  // none); the steps timed since the last decision.
  int64_t budget_steps_ = 0, budget_most_ = 0;
  int64_t budget_first_ = 0, budget_next_at_ = 0;
  double budget_timed_s_ = 0.0;
  int64_t budget_timed_ = 0;
  double step_flops_ = 0.0, peak_flops_ = 0.0, peak_per_core_ = 0.0;
  int64_t mem_bytes_ = 0;
  Clock::time_point run_start_, loop_start_;
};

Trainer::Trainer(TrainConfig cfg, Communicator& world, RunData data, const RunShape& shape)
    : cfg_(std::move(cfg)),
      world_(world),
      shape_(shape),
      mesh_(world, {shape.dp, shape.tp, shape.pp}),
      lead_(world.rank() == 0),
      run_start_(Clock::now()) {
  take_run(std::move(data));
  check_other_keys();
  set_up_rank();
  build_layout_and_strategies();
  load_or_init();
  check_replicas_agree();
  set_up_checkpointing();
  build_chunks();
  set_up_batches_and_logging();
  set_up_mfu();
  mem_bytes_ = dp_sync_->resident_bytes() + int64_t(optimizer_->state_bytes());
  print_header();
}

void Trainer::check_other_keys() const {
  // The learning-rate schedule's keys, checked before any work rather than at the first step.
  learning_rate(cfg_.optim, 1, cfg_.steps);
  TRELLIS_REQUIRE(cfg_.steps >= 0, "steps must be >= 0");
  TRELLIS_REQUIRE(!task_ || !cfg_.document_mask,
                  "document_mask applies to language-model token shards, not to task data");
  TRELLIS_REQUIRE(cfg_.val_batches >= 0, "val_batches must be >= 0");
  TRELLIS_REQUIRE(cfg_.time_budget >= 0.0 && std::isfinite(cfg_.time_budget),
                  "time_budget must be >= 0 minutes (got {})", cfg_.time_budget);
  TRELLIS_REQUIRE(cfg_.peak_gflops_per_core >= 0.0, "peak_gflops_per_core must be >= 0 (got {})",
                  cfg_.peak_gflops_per_core);
}

void Trainer::set_up_rank() {
  if (const char* plant = std::getenv("TRELLIS_TEST_DROPOUT_PLANT"); plant && *plant == '1')
    dropout_plant_ = uint64_t(world_.rank()) * 0x9E3779B97F4A7C15ull;
  for (Communicator* c : {&world_, &mesh_.dp_comm(), &mesh_.tp_comm(), &mesh_.pp_comm()})
    c->set_timeout(cfg_.comm_timeout);
  threads_ = cfg_.threads > 0 ? cfg_.threads : default_threads_per_rank();
  omp_set_num_threads(threads_);
  // Every rank computes in the same precision: under `auto`, bf16 only if all of them have it.
  const Precision precision = choose_precision(cfg_.precision);
  double fp32_somewhere = precision.compute == DType::F32 ? 1.0 : 0.0;
  world_.all_reduce_max(&fp32_somewhere, 1);
  compute_ = fp32_somewhere > 0.0 ? DType::F32 : DType::BF16;
  shape_.compute = compute_;
  if (lead_ && !precision.notice.empty())
    fmt::print(stderr, "trellis: {}\n", precision.notice);
}

void Trainer::build_layout_and_strategies() {
  build_pipeline_chunks();
  // This rank's tensor-parallel slices of its pipeline stage.
  layout_ = std::make_unique<ParamLayout>(mc_, mesh_.tp(), mesh_.tp_rank(), &stage_);
  n_ = layout_->size();
  const ZeroStage stage = zero_stage(shape_.zero);
  dp_sync_ = make_data_parallel_sync(mesh_.dp_comm(), stage, *layout_,
                                     size_t(cfg_.bucket_mb * 1024 * 1024),
                                     mixed_precision_state(stage, compute_ == DType::BF16),
                                     shape_.grad_dtype,
                                     bf16_gradient_storage(stage, shape_.grad_dtype, mesh_.dp(),
                                                           mesh_.tp(), mesh_.pp()));
  optimizer_ = std::make_unique<Optimizer>(cfg_.optim, *layout_, dp_sync_->owned());
  check_memory_plan();
}

void Trainer::set_up_checkpointing() {
  checkpointer_ = std::make_unique<Checkpointer>(world_, cfg_.out, cfg_.async_save);
  checkpointer_->on_commit = [this](int64_t step, const std::string& dir, double write_s) {
    if (!lead_) return;
    nlohmann::json row = {{"step", step},
                          {"checkpoint_write_ms", write_s * 1e3},
                          {"checkpoint_bytes", checkpointer_->last_bytes()}};
    if (std::filesystem::path(dir).filename() == "best") row["checkpoint"] = "best";
    log_->write(row, "checkpoint");
  };
  checkpointer_->reserve(owned_state());
  // ZeRO-2/3 keep their shards (or, resumed, gather the rest from them); ZeRO-3 frees the blocks.
  dp_sync_->adopt_params(!params_compact_);
}

void Trainer::build_chunks() {
  tp_ = std::make_unique<TensorParallel>(&mesh_.tp_comm(), cfg_.sequence_parallel);
  std::vector<ModelChunk*> chunk_models;
  for (const StageSpec& c : chunks_) {
    models_.push_back(std::make_unique<ModelChunk>(*layout_, dp_sync_->params(), dp_sync_->grads(),
                                                   *tp_, &c, compute_));
    if (BlockHooks* hooks = dp_sync_->hooks()) models_.back()->add_block_hooks(*hooks);
    models_.back()->set_label_smoothing(float(cfg_.label_smoothing));
    models_.back()->set_subword_ngrams(subword_.get());
    // Mixed-precision state: the GEMMs read the bf16 working weights the sync gathers. Else the
    // trainer says when the weights change (weights_changed), so bf16 copies last a step.
    if (const uint16_t* bits = dp_sync_->working_bits())
      models_.back()->use_working_weights(dp_sync_->params(), bits);
    else
      models_.back()->set_weight_copies(training_weight_copies(shape_.zero));
    chunk_models.push_back(models_.back().get());
  }
  pipe_ = std::make_unique<Pipeline>(mesh_.pp_comm(), chunk_models, shape_.micro_batch, T_,
                                     shape_.recompute, splits_backward(shape_.schedule));
  tied_ = std::make_unique<TiedWeights>(mesh_.pp_comm(), *layout_, cfg_.comm_timeout);
}

void Trainer::set_up_batches_and_logging() {
  batches_ = task_ ? make_task_batches(*task_, T_, G_, cfg_.seed, cfg_.shuffle, augment_,
                                       cfg_.patch_context)
                   : make_lm_batches(lm_data_, T_, G_, cfg_.seed, cfg_.shuffle, cfg_.document_mask);
  for (int i = 0; i < batches_->val_sets(); ++i) val_items_ += val_items_of(i);
  best_ =
      BestTracker(cfg_.keep_best, cfg_.early_stop_patience, mc_.num_classes > 0, val_items_ > 0);
  best_.restore(resumed_best_);
  if (lead_)
    log_ = std::make_unique<MetricsLog>(cfg_.out, cfg_.tensorboard,
                                        resumed_from_.empty() ? -1 : start_step_);
}

void Trainer::set_up_mfu() {
  // An untied input embedding is a lookup: its parameters do no multiply-adds.
  // (A classifier's token embedding is one too; feature inputs have none; nor does the subword
  // n-gram table.)
  const int64_t lookup =
      (mc_.tied_lm_head() || mc_.input_features > 0 ? 0 : int64_t(mc_.vocab_size) * mc_.n_embd) +
      int64_t(mc_.subword_ngrams) * mc_.n_embd;
  step_flops_ = flops_per_token(mc_, ParamLayout(mc_).count() - lookup, T_) * double(G_ * T_);
  // MFU divides by the peak of the cores in use: the user's figure, or a probe of the FMA rate of
  // the precision in use (the largest over the ranks: oversubscribed ranks probe while others
  // run).
  peak_per_core_ = cfg_.peak_gflops_per_core;
  if (peak_per_core_ == 0.0) {
    peak_per_core_ = measure_peak_gflops_per_core(compute_);
    world_.all_reduce_max(&peak_per_core_, 1);
  }
  peak_flops_ = peak_per_core_ * 1e9 * threads_ * world_.size();
}

void Trainer::take_run(RunData data) {
  lm_data_ = std::move(data.lm);
  task_ = std::move(data.task);
  augment_ = data.augment;
  tokenizer_ = data.tokenizer;
  mc_ = data.model;
  subword_ = subword_ngrams_for(mc_, tokenizer_.kind, tokenizer_.dir);
  T_ = data.T;
  G_ = cfg_.batch_size;
  per_rank_ = G_ / shape_.dp;
}

// Pipeline: pp * V model chunks, chunk g on pipeline rank g % pp. The schedule is built now so that
// impossible combinations are refused before any work.
void Trainer::build_pipeline_chunks() {
  const int pp = mesh_.pp(), pp_rank = mesh_.pp_rank();
  RankChunks mine = rank_chunks(mc_, pp, shape_.virtual_stages, shape_.layer_split, pp_rank);
  step_ops_ =
      build_schedule(shape_.schedule, pp, pp_rank, int(shape_.accum), shape_.virtual_stages);
  stage_ = std::move(mine.stage);
  chunks_ = std::move(mine.chunks);
}

// --dry-run and the planner size this rank from the sizes alone (train/memory_plan); the
// optimizer state they count follows ZeRO's shard arithmetic, which must be what this rank owns.
void Trainer::check_memory_plan() const {
  const RankMemory plan =
      predict_rank_memory(shape_, mesh_.pp_rank(), mesh_.dp_rank(), mesh_.tp_rank());
  TRELLIS_CHECK(int64_t(optimizer_->state_bytes()) == plan.optimizer,
                "the memory plan counts {} bytes of optimizer state on this rank, the optimizer "
                "holds {}",
                plan.optimizer, optimizer_->state_bytes());
}

void Trainer::load_or_init() {
  if (cfg_.resume) {
    std::vector<std::string> skipped;
    resumed_from_ = find_latest_checkpoint(cfg_.out, &skipped);
    for (const std::string& why : skipped)
      if (lead_)
        fmt::print(stderr, "trellis: warning: --resume skips an incomplete checkpoint: {}\n", why);
    if (resumed_from_.empty() && lead_ && !cfg_.quiet)
      fmt::print("trellis: --resume: no checkpoint in {} yet, starting from step 0\n", cfg_.out);
  }
  if (resumed_from_.empty()) {
    init_params(*layout_, cfg_.seed, dp_sync_->params());
    if (!cfg_.init_from.empty()) {
      // Fine-tuning: DIR's tensors over the seeded start of the whole model, so a task head DIR
      // lacks starts the same in every layout.
      const ParamLayout global(mc_);
      std::vector<float> all(global.size());
      init_params(global, cfg_.seed, all.data());
      const PretrainedReport r = load_pretrained(cfg_.init_from, global, all.data());
      copy_from_global(*layout_, global, all.data(), dp_sync_->params());
      if (lead_ && !cfg_.quiet)
        fmt::print("trellis: initialised from {} ({} tensors{})\n", cfg_.init_from, r.loaded.size(),
                   r.initialised.empty()
                       ? ""
                       : fmt::format("; task head {} initialised", fmt::join(r.initialised, ", ")));
    }
    return;
  }
  const std::string state_path = resumed_from_ + "/state.json";
  const nlohmann::json state = parse_checkpoint_state(read_file(state_path), state_path);
  // `trellis average` keeps parameters only: continuing from it is a new run, not this one's.
  TRELLIS_REQUIRE(!state.contains("averaged_from"),
                  "{}: an averaged checkpoint (trellis average) has no optimizer state or data "
                  "position to resume; start a new run from it with --init-from",
                  resumed_from_);
  // Any layout's checkpoint (sharded or whole-file): this rank reads the slices it holds.
  CheckpointReader reader(resumed_from_);
  // The tokens the run goes on with must be the ones it began with.
  const std::string saved_tokenizer = resumed_from_ + "/" + kSentencePieceFile;
  if (std::filesystem::exists(saved_tokenizer))
    TRELLIS_REQUIRE(read_file(saved_tokenizer) == tokenizer_.model,
                    "{}: the data {} is not encoded with this SentencePiece model; resume with the "
                    "data the run was trained on",
                    saved_tokenizer, cfg_.data);
  else
    TRELLIS_REQUIRE(tokenizer_.model.empty(),
                    "{}: the checkpoint has no {}, but the data {} is encoded with SentencePiece; "
                    "resume with the data the run was trained on",
                    resumed_from_, kSentencePieceFile, cfg_.data);
  const ModelConfig saved_model = read_model_config(resumed_from_ + "/config.json");
  // The same model iff the same config.json: every size and block choice (a tied head, biases,
  // eps, theta), so no configured tensor can be missing from the checkpoint.
  nlohmann::json saved_cfg = family_of(saved_model.arch).to_hf_config(saved_model);
  nlohmann::json want_cfg = family_of(mc_.arch).to_hf_config(mc_);
  saved_cfg.update(block_choices(saved_model));
  want_cfg.update(block_choices(mc_));
  for (const auto& [key, value] : want_cfg.items())
    TRELLIS_REQUIRE(saved_cfg.contains(key) && saved_cfg[key] == value,
                    "{}: the checkpoint's {} is {}, the configured model's {}", resumed_from_, key,
                    saved_cfg.contains(key) ? saved_cfg[key].dump() : "missing", value.dump());
  // ZeRO-2/3 read only their shard: no rank materialises its whole stage.
  params_compact_ = dp_sync_->owned_apart();
  if (params_compact_)
    reader.read(*layout_, dp_sync_->owned(), "params", dp_sync_->owned_params());
  else
    reader.read(*layout_, {{0, n_}}, "params", dp_sync_->params());
  for (auto& [name, buf] : optimizer_->state())
    reader.read(*layout_, optimizer_->owned(), name, buf->data());
  start_step_ = state.at("step").get<int64_t>();
  resumed_best_ = state.value("best", nlohmann::json());
  // The steps the budget allowed when the run began: a resumed run ends where it would have.
  // (No later decision is taken: this process's clock began at the resume.)
  budget_steps_ = state.value("budget_steps", int64_t(0));
  if (cfg_.time_budget > 0.0 && budget_steps_ > 0) cfg_.steps = std::min(cfg_.steps, budget_steps_);
}

// Every DP replica must start from identical weights (they are generated, never broadcast).
void Trainer::check_replicas_agree() {
  double sums[2] = {0.0, 0.0};
  const float* params = dp_sync_->params();
  for (size_t i = 0; i < n_; ++i) sums[0] += double(params[i]) * double((i % 7919) + 1);
  sums[1] = -sums[0];
  mesh_.dp_comm().all_reduce_max(sums, 2);
  TRELLIS_CHECK(sums[0] == -sums[1], "ranks start from different weights (checksum {} vs {})",
                sums[0], -sums[1]);
}

void Trainer::print_header() const {
  if (!lead_ || cfg_.quiet) return;
  const int pp = mesh_.pp();
  fmt::print(
      "trellis: {} ({}) | {} layers{}, {} heads{}, width {}, context {}, vocab {} ({} padded) | "
      "{:.2f}M parameters\n",
      cfg_.init_from.empty() ? cfg_.model : cfg_.init_from, mc_.arch, mc_.n_layer,
      mc_.encoder_decoder() ? fmt::format(" + {} decoder layers", mc_.n_dec_layer) : "", mc_.n_head,
      mc_.kv_heads() != mc_.n_head ? fmt::format(" ({} kv)", mc_.kv_heads()) : "", mc_.n_embd,
      mc_.block_size, mc_.vocab_size, mc_.padded_vocab(), double(ParamLayout(mc_).count()) / 1e6);
  if (task_) {
    const TaskMeta& m = task_->meta;
    fmt::print("trellis: data {} | {}{}: {} train / {} {} examples, {} positions{}\n", cfg_.data,
               m.task, m.task == "classify" ? fmt::format(" ({} classes)", m.classes.size()) : "",
               task_->train.size(), task_->val.size(), m.val_split, T_,
               mc_.num_classes ? fmt::format(", {} pooling", pooling_name(mc_.pooling)) : "");
  } else {
    int64_t windows = 0;
    for (const Corpus& c : lm_data_.corpora) windows += (c.train.size() - 1) / T_;
    fmt::print("trellis: data {} | {} train / {} val tokens | {} windows of {}\n", lm_data_.source,
               lm_data_.train_tokens(), lm_data_.val_tokens(), windows, T_);
  }
  fmt::print(
      "trellis: world {} (dp {}, tp {}{}, pp {}{}, zero {}{}) | {} threads/rank, {} | batch {} "
      "x {} tokens = {} per rank x {} micro-batches of {}{}\n",
      world_.size(), mesh_.dp(), mesh_.tp(), tp_->sequence_parallel() ? " + sequence parallel" : "",
      pp,
      pp > 1
          ? fmt::format(" {}{}", schedule_name(shape_.schedule),
                        shape_.virtual_stages > 1 ? fmt::format(" x{}", shape_.virtual_stages) : "")
          : "",
      cfg_.zero,
      shape_.grad_dtype == GradReduceDtype::Bf16 && mesh_.dp() > 1
          ? bf16_gradient_storage(zero_stage(cfg_.zero), shape_.grad_dtype, mesh_.dp(),
                                  mesh_.tp(), pp)
                ? ", bf16 gradients"
                : ", gradients reduced in bf16"
          : "",
      threads_, precision_name(compute_), G_, T_, per_rank_, shape_.accum,
      shape_.micro_batch, resumed_from_.empty() ? "" : " | resumed from " + resumed_from_);
  // Next-token targets are inputs an encoder sees (bidirectionally, or through cross-attention).
  if (!task_ && (!mc_.causal || mc_.encoder_decoder()))
    fmt::print(
        "trellis: note: the {} model sees the next tokens it is asked to predict in these windows: "
        "this trains its computation for checks, not a useful model (train it on a task: "
        "`trellis prepare --task classify|translate`)\n",
        mc_.arch);
  std::fflush(stdout);
}

StepStats Trainer::forward_backward_step(int64_t step) {
  StepStats st;
  weights_changed();
  dp_sync_->begin_step();
  // Every rank knows the global batch's targets (tokens, real target tokens or examples).
  const int64_t targets = batches_->step_targets(step - 1);
  const float grad_scale = 1.0f / float(targets);
  auto load = [&](int k, Context& ctx) {
    const int64_t first =
        mesh_.dp_rank() * per_rank_ + k * shape_.micro_batch;  // in the global batch
    batches_->fill(step - 1, first, shape_.micro_batch, ctx);
    // Dropout masks address the global step and sequences (invariant 6), never the rank; the
    // planted key of dropout_test_plant is the exception that the layout tests must reject.
    ctx.dropout = {true, cfg_.seed ^ dropout_plant_, step - 1, first};
    return shape_.micro_batch;
  };
  // Without a pipeline, buckets are reduced while backward still runs (chunks finish in layout
  // order); with one, after the schedule.
  std::function<void(int)> on_block_done;
  if (dp_sync_->overlaps() && mesh_.pp() == 1)
    on_block_done = [&](int l) { dp_sync_->ready_from(l >= 0 ? layout_->block_offset(l) : 0); };
  const PipelineStats ps = pipe_->run(step_ops_, load, grad_scale, on_block_done);
  if (!cfg_.trace.empty() && step - start_step_ == cfg_.trace_steps) {
    write_trace(cfg_.trace, world_, mesh_, pipe_->trace());
    pipe_->record_trace(false);
  }
  tied_->reduce(dp_sync_->grads());
  st.comm_exposed = dp_sync_->reduce_gradients();
  // After the data-parallel sync, which may still be writing buckets until it returns.
  reduce_replicated_grads(*tp_, *layout_, dp_sync_->owned(), dp_sync_->owned_grads());
  // The loss is known on the last stage only; the bubble is averaged over the stages.
  double pp_stats[2] = {ps.loss_sum, 1.0 - ps.compute_s / ps.total_s};
  st.peak_micro = ps.peak_contexts;  // activations alive at once, largest stage
  if (mesh_.pp() > 1) {
    mesh_.pp_comm().all_reduce_sum(pp_stats, 2);
    mesh_.pp_comm().all_reduce_max(&st.peak_micro, 1);
    st.bubble = pp_stats[1] / mesh_.pp();
  }
  double loss_sum = pp_stats[0];
  mesh_.dp_comm().all_reduce_sum(&loss_sum, 1);
  st.loss = loss_sum / double(targets);
  return st;
}

void Trainer::optimizer_step(int64_t step, StepStats& st) {
  // Each rank sums its shard; the norm then sums over tp (slices), pp (stages) and, with ZeRO,
  // dp (shards).
  const uint16_t* grad_bits = dp_sync_->owned_grad_bits();  // ZeRO-0's bf16 gradients
  double norm_sq =
      grad_sum_squares(*layout_, dp_sync_->owned(), dp_sync_->owned_grads(), grad_bits);
  if (mesh_.tp() > 1) mesh_.tp_comm().all_reduce_sum(&norm_sq, 1);
  if (mesh_.pp() > 1) mesh_.pp_comm().all_reduce_sum(&norm_sq, 1);
  if (dp_sync_->sharded()) mesh_.dp_comm().all_reduce_sum(&norm_sq, 1);
  st.grad_norm = std::sqrt(norm_sq);
  // Clipping rides along the optimizer's sweep instead of a pass of its own.
  const float clip = cfg_.optim.grad_clip;
  const float grad_mul =
      clip > 0.0f && st.grad_norm > clip ? float(clip / (st.grad_norm + 1e-6)) : 1.0f;
  st.lr = learning_rate(cfg_.optim, step, cfg_.steps);
  if (grad_bits)
    optimizer_->step_compact(dp_sync_->owned_params(), grad_bits, float(st.lr), step, grad_mul);
  else
    optimizer_->step_compact(dp_sync_->owned_params(), dp_sync_->owned_grads(), float(st.lr),
                             step, grad_mul);
  st.comm_exposed += dp_sync_->gather_parameters();
}

// Mean loss over the first val_items_ validation items (windows or examples), split across DP
// ranks and run forward-only through the pipeline in micro-batches of b; a classifier's
// predictions also fill a confusion matrix.
EvalResult Trainer::evaluate() {
  const int sets = batches_->val_sets();
  if (sets == 1) return evaluate_set(val_items_);
  // A mixture: each dataset's validation windows on their own; the overall loss is the mean over
  // all their targets.
  EvalResult all;
  double sum = 0.0, targets = 0.0;
  for (int i = 0; i < sets; ++i) {
    const int64_t items = val_items_of(i);
    if (items == 0) continue;
    batches_->select_val(i);
    const EvalResult r = evaluate_set(items);
    const double n = double(batches_->val_targets(items));
    sum += r.loss * n;
    targets += n;
    all.items += items;
    all.per_set.emplace_back(batches_->val_set_name(i), r.loss);
  }
  batches_->select_val(0);
  all.loss = sum / targets;
  return all;
}

// Validation items of set i: val_batches global batches of them (all with val_batches 0). Leaves
// set 0 selected.
int64_t Trainer::val_items_of(int set) {
  batches_->select_val(set);
  const int64_t n = batches_->val_items();
  batches_->select_val(0);
  return cfg_.val_batches > 0 ? std::min(cfg_.val_batches * G_, n) : n;
}

void Trainer::weights_changed() {
  for (const std::unique_ptr<ModelChunk>& m : models_) m->weights_changed();
}

EvalResult Trainer::evaluate_set(int64_t items) {
  weights_changed();
  const int64_t b = shape_.micro_batch;
  const int64_t lo = items * mesh_.dp_rank() / mesh_.dp();
  const int64_t hi = items * (mesh_.dp_rank() + 1) / mesh_.dp();
  // Every data-parallel rank runs the micro-batches of the largest share, ceil(items / dp), not
  // of its own: under ZeRO-3 each forward gathers every block over the dp communicator (ZeRO-2
  // the first forward after an update), so a rank with a micro-batch fewer would leave the others
  // in a gather it never posts (DESIGN invariant 5). A micro-batch past this rank's share
  // computes the first item and counts none of its rows.
  const int64_t largest = (items + mesh_.dp() - 1) / mesh_.dp();
  const int micro = int((largest + b - 1) / b);
  const int K = mc_.num_classes;
  std::vector<double> counts(size_t(K * K), 0.0);  // [true][predicted]
  double sum = 0.0;
  if (micro > 0) {
    auto load = [&](int k, Context& ctx) {
      const int64_t first = lo + k * b, rows = std::clamp<int64_t>(hi - first, 0, b);
      if (rows > 0)
        batches_->fill_val(first, rows, ctx);
      else
        batches_->fill_val(0, 1, ctx);
      ctx.dropout.train = false;  // a pooled Context may have trained: validation never drops
      return rows;
    };
    auto collect = [&](int, const Context& ctx, int64_t rows) {
      for (int64_t r = 0; r < rows && K > 0; ++r)
        counts[size_t(ctx.labels[size_t(r)] * K + ctx.predictions[size_t(r)])] += 1.0;
    };
    sum = pipe_->run(forward_schedule(micro, shape_.virtual_stages), load, 0.0f, {}, collect)
              .loss_sum;
  }
  counts.push_back(sum);
  mesh_.pp_comm().all_reduce_sum(counts.data(), int64_t(counts.size()));
  mesh_.dp_comm().all_reduce_sum(counts.data(), int64_t(counts.size()));
  EvalResult r;
  r.items = items;
  r.loss = counts.back() / double(batches_->val_targets(items));
  r.confusion.assign(size_t(K), std::vector<int64_t>(size_t(K), 0));
  for (int t = 0; t < K; ++t)
    for (int p = 0; p < K; ++p)
      r.confusion[size_t(t)][size_t(p)] = int64_t(counts[size_t(t * K + p)]);
  return r;
}

void Trainer::log_validation(int64_t step, const EvalResult& r) {
  if (!lead_) return;
  nlohmann::json row = {{"step", step}, {"val_loss", r.loss}};
  std::string extra;
  for (const auto& [name, loss] : r.per_set) {
    row["val_loss/" + name] = loss;
    extra += fmt::format(" | {} {:.4f}", name, loss);
  }
  if (mc_.num_classes > 0) {
    row["val_accuracy"] = accuracy(r.confusion);
    row["val_macro_f1"] = macro_f1(r.confusion);
    extra = fmt::format(" | accuracy {:.4f} | macro-F1 {:.4f}", accuracy(r.confusion),
                        macro_f1(r.confusion));
  }
  log_->write(row, "val");
  if (!cfg_.quiet) fmt::print("step {} | val loss {:.4f}{}\n", step, r.loss, extra);
}

// The confusion matrix on the terminal, and OUT/confusion.json.
void Trainer::print_confusion(const ConfusionMatrix& m) const {
  const std::vector<std::string>& names = task_->meta.classes;
  nlohmann::json j = {{"classes", names},
                      {"split", task_->meta.val_split},
                      {"confusion", m},
                      {"accuracy", accuracy(m)},
                      {"macro_f1", macro_f1(m)}};
  write_file_atomic(cfg_.out + "/confusion.json", j.dump(2) + "\n");
  if (cfg_.quiet) return;
  size_t w = 5;
  for (const auto& n : names) w = std::max(w, std::min<size_t>(n.size(), 16) + 1);
  fmt::print(
      "trellis: confusion matrix on {} ({} examples; rows: true class, columns: predicted)\n",
      task_->meta.val_split, val_items_);
  fmt::print("{:>{}}", "", w);
  for (size_t p = 0; p < m.size(); ++p) fmt::print("{:>{}}", p, 7);
  fmt::print("\n");
  for (size_t t = 0; t < m.size(); ++t) {
    const std::string id = std::to_string(t);
    fmt::print("{:>{}}", names[t] == id ? id : names[t].substr(0, 16) + " " + id, w + 3);
    for (int64_t c : m[t]) fmt::print("{:>7}", c);
    fmt::print("\n");
  }
}

bool Trainer::track_best(int64_t step, const EvalResult& val) {
  if (!best_.enabled()) return false;
  double value = val.loss;
  if (best_.metric() == BestMetric::ValAccuracy) value = accuracy(val.confusion);
  if (best_.metric() == BestMetric::ValMacroF1) value = macro_f1(val.confusion);
  // Every rank takes rank 0's value (a sum with zeros is exact), so all decide alike and the
  // save below is collective everywhere or nowhere.
  if (!lead_) value = 0.0;
  world_.all_reduce_sum(&value, 1);
  if (best_.update(step, value)) save(step, "best");
  if (!best_.should_stop()) return false;
  if (lead_) {
    log_->write({{"step", step},
                 {"early_stop", true},
                 {"best_step", best_.best_step()},
                 {"best_" + best_.name(), best_.best_value()}},
                "early_stop");
    if (!cfg_.quiet)
      fmt::print(
          "trellis: early stop at step {}: {} has not improved for {} validations (best "
          "{:.4f} at step {})\n",
          step, best_.name(), best_.since(), best_.best_value(), best_.best_step());
  }
  return true;
}

// Each rank writes what it owns, in parallel (io/sharded_checkpoint.h); any layout resumes it.
// Returns the newest committed checkpoint (with --async-save, an earlier one until the write ends).
std::string Trainer::save(int64_t step, const std::string& name) {
  nlohmann::json task;
  if (task_) {
    const TaskMeta& m = task_->meta;
    task = {{"task", m.task}, {"special_token", m.special_token}, {"seq_len", T_}};
    if (!m.classes.empty()) task["classes"] = m.classes;
    if (m.feature_dim > 0) task["feature_dim"] = m.feature_dim;
    if (cfg_.patch_context > 0) task["patch_context"] = cfg_.patch_context;
  }
  nlohmann::json conf;
  for (auto& k : config_keys(cfg_)) conf[k.name] = k.get();
  const nlohmann::json state = {{"step", step},
                                {"tokens_seen", step * G_ * T_},
                                {"data",
                                 {{"next_step", step},
                                  {"global_batch", G_},
                                  {"seq_len", T_},
                                  {"shuffle", cfg_.shuffle},
                                  {"seed", cfg_.seed}}},
                                {"rng", {{"kind", "philox4x32-10"}, {"seed", cfg_.seed}}},
                                {"best", best_.state()},
                                {"budget_steps", budget_steps_},
                                {"config", conf}};
  std::vector<std::pair<std::string, std::string>> files;
  if (lead_)
    files = {{"config.json", checkpoint_config_json(mc_, tokenizer_, task)},
             // paths and config values are bytes, not necessarily UTF-8: replaced, not refused
             {"state.json", state.dump(2, ' ', false, nlohmann::json::error_handler_t::replace)}};
  if (lead_ && !tokenizer_.model.empty()) files.emplace_back(kSentencePieceFile, tokenizer_.model);
  const nlohmann::json layout = {{"world", world_.size()},
                                 {"dp", mesh_.dp()},
                                 {"tp", mesh_.tp()},
                                 {"pp", mesh_.pp()},
                                 {"virtual_stages", shape_.virtual_stages},
                                 {"zero", cfg_.zero}};
  const double stall = checkpointer_->save(step, *layout_, owned_state(), files,
                                           {{"step", step}, {"layout", layout}}, name);
  if (lead_) {
    nlohmann::json row = {{"step", step},
                          {"checkpoint_stall_ms", stall * 1e3},
                          {"checkpoint_async", cfg_.async_save}};
    if (!name.empty()) row["checkpoint"] = name;
    log_->write(row, "checkpoint");
  }
  return checkpointer_->last_committed();
}

OwnedArrays Trainer::owned_state() {
  OwnedArrays o;
  float* params = dp_sync_->owned_params();
  auto states = optimizer_->state();
  if (!dp_sync_->sharded() && mesh_.dp() > 1) {
    // Replicas hold the same values (owned: the whole buffer): each writes 1/dp of them.
    const ShardRange r = shard_range(n_, mesh_.dp(), mesh_.dp_rank());
    o.ranges = {{r.begin, r.end}};
    o.arrays.emplace_back("params", params + r.begin);
    for (auto& [name, buf] : states) o.arrays.emplace_back(name, buf->data() + r.begin);
    return o;
  }
  o.ranges = dp_sync_->owned();
  o.arrays.emplace_back("params", params);
  for (auto& [name, buf] : states) o.arrays.emplace_back(name, buf->data());
  return o;
}

void Trainer::log_step(int64_t step, const StepStats& st) {
  // Memory of the largest rank (ZeRO and TP make ranks differ). The allocator's high-water mark
  // counts from the first step (set-up may hold more, e.g. the whole model while ZeRO-3 shards it).
  const int64_t alloc_peak = memory::peak_bytes();
  double mem[3] = {double(mem_bytes_), double(peak_rss_bytes()), double(alloc_peak)};
  world_.all_reduce_max(mem, 3);
  if (!lead_) return;
  const double tokens_per_s = double(G_ * T_) / st.seconds;
  log_->write(
      {{"step", step},
       {"loss", st.loss},
       {"lr", st.lr},
       {"grad_norm", st.grad_norm},
       {"tokens_per_s", tokens_per_s},
       {"mfu", step_flops_ / st.seconds / peak_flops_},
       {"step_ms", st.seconds * 1e3},
       {"start_s", st.start},
       {"compute_ms", (st.seconds - st.comm_exposed - st.tp_comm) * 1e3},
       {"comm_exposed_ms", st.comm_exposed * 1e3},
       {"tp_comm_ms", st.tp_comm * 1e3},
       {"mem_bytes", mem_bytes_},
       {"mem_bytes_max", mem[0]},
       {"peak_rss_bytes", peak_rss_bytes()},
       {"peak_rss_bytes_max", mem[1]},
       {"alloc_peak_bytes", alloc_peak},
       {"alloc_peak_bytes_max", mem[2]},
       {"bubble", st.bubble},
       {"bubble_theory", theoretical_bubble(mesh_.pp(), int(shape_.accum), shape_.virtual_stages,
                                            shape_.schedule)},
       {"peak_micro_batches", st.peak_micro},
       {"activation_bytes", pipe_->activation_bytes()}},
      "train");
  if (!cfg_.quiet && (step % std::max<int64_t>(1, cfg_.log_every) == 0 || step == cfg_.steps)) {
    const double eta =
        seconds_since(loop_start_) / double(step - start_step_) * double(cfg_.steps - step);
    fmt::print(
        "step {:>{}}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} ms | "
        "{:.0f} tok/s | MFU {:.1f}% | ETA {}\n",
        step, std::to_string(cfg_.steps).size(), cfg_.steps, st.loss, st.lr, st.grad_norm,
        st.seconds * 1e3, tokens_per_s, 100.0 * step_flops_ / st.seconds / peak_flops_,
        format_duration(eta));
    std::fflush(stdout);
  }
}

// time_budget: after the first timed steps, the run's last step becomes the last that fits the
// budget (train/time_budget.h), decided alike on every rank; then again after each tenth of the
// run, from the steps timed since the last decision.
void Trainer::fit_time_budget(int64_t step, double step_seconds) {
  if (step <= start_step_ + kBudgetWarmSteps) return;
  budget_timed_s_ += step_seconds;
  ++budget_timed_;
  const bool first = budget_steps_ == 0;
  const bool due = budget_timed_ >= kBudgetTimedSteps && (first || step >= budget_next_at_);
  if (!due && step < cfg_.steps) return;
  BudgetClock c;
  c.budget_s = cfg_.time_budget * 60.0;
  c.elapsed_s = seconds_since(kProcessStart);
  c.step_s = budget_timed_s_ / double(budget_timed_);
  // Tests only: "A[,B]", a step takes A seconds until the first decision and B after it (default
  // A), and no time passes before the first decision, so every decision is reproducible.
  if (const char* s = std::getenv("TRELLIS_TEST_STEP_SECONDS"); s && *s) {
    char* rest = nullptr;
    const double a = std::strtod(s, &rest);
    const double b = rest && *rest == ',' ? std::strtod(rest + 1, nullptr) : a;
    c.step_s = first ? a : b;
    c.elapsed_s = first ? 0.0 : double(step - budget_first_) * b;
  }
  // Every rank must reach the same decision: the slowest step and the latest clock count.
  double clock[2] = {c.step_s, c.elapsed_s};
  world_.all_reduce_max(clock, 2);
  c.step_s = clock[0], c.elapsed_s = clock[1];
  // An evaluation is a forward pass (about a third of a training step's work) over the split.
  c.val_s = double(val_items_) / double(G_) * c.step_s / 3.0;
  c.val_every = cfg_.val_every;
  if (first) budget_most_ = cfg_.steps;
  budget_steps_ = std::max(step, budget_last_step(c, step, budget_most_));
  cfg_.steps = budget_steps_;
  budget_timed_s_ = 0.0;
  budget_timed_ = 0;
  // A machine's speed drifts (a VM's first steps ran 57 ms, its later ones 66-80): decided again
  // a tenth of the run later, unless that falls within the last timed steps.
  if (first) budget_first_ = step;
  budget_next_at_ = step + std::max(kBudgetTimedSteps, budget_steps_ / 10);
  if (budget_next_at_ + kBudgetTimedSteps > budget_steps_) budget_next_at_ = 0;
  if (lead_ && !cfg_.quiet)
    fmt::print("trellis: time_budget {:g} min: {}{} of {} steps fit at {:.0f} ms a step{}\n",
               cfg_.time_budget, first ? "" : fmt::format("re-timed at step {}: ", step),
               budget_steps_, budget_most_, c.step_s * 1e3,
               c.val_s > 0 ? fmt::format(" and {:.1f} s an evaluation", c.val_s) : "");
}

int Trainer::run() {
  double best_val = INFINITY, tokens_per_s_sum = 0.0;
  int64_t timed_steps = 0, stopped_at = 0;
  int stopped_by = 0;  // the stop signal that ended the run (stop_signal.h)
  std::string last_checkpoint;
  world_.barrier();  // a common time origin for the trace
  pipe_->record_trace(!cfg_.trace.empty());
  loop_start_ = Clock::now();
  memory::reset_peak();
  fault_point(world_.rank(), 0);  // start-up, fresh or resumed
  // A run resumed from the checkpoint where early stopping ended it trains no further.
  int64_t early_stop_step = best_.should_stop() ? start_step_ : -1;
  if (early_stop_step >= 0 && lead_ && !cfg_.quiet)
    fmt::print("trellis: early stopping ended this run at step {}: nothing more to train\n",
               start_step_);
  for (int64_t step = start_step_ + 1; step <= cfg_.steps && early_stop_step < 0; ++step) {
    fault_point(world_.rank(), step);
    const auto t0 = Clock::now();
    StepStats st = forward_backward_step(step);
    optimizer_step(step, st);
    checkpointer_->poll();  // commits an --async-save whose writes all ended
    st.seconds = seconds_since(t0);
    st.start = std::chrono::duration<double>(t0 - kProcessStart).count();
    st.tp_comm = tp_->take_comm_seconds();
    if (step > start_step_ + 1 || cfg_.steps == start_step_ + 1) {
      tokens_per_s_sum += double(G_ * T_) / st.seconds;
      ++timed_steps;
    }
    log_step(step, st);
    if (cfg_.time_budget > 0.0 && (budget_steps_ == 0 || budget_next_at_ > 0))
      fit_time_budget(step, st.seconds);
    bool stopping = step == cfg_.stop_at;
    const bool last = step == cfg_.steps;
    if (val_items_ > 0 && ((cfg_.val_every > 0 && step % cfg_.val_every == 0) || last)) {
      const EvalResult val = evaluate();
      best_val = std::min(best_val, val.loss);
      log_validation(step, val);
      if (track_best(step, val)) {
        stopping = true;
        early_stop_step = step;
      }
      if ((last || early_stop_step == step) && lead_ && mc_.num_classes > 0)
        print_confusion(val.confusion);
    }
    // A stop signal on any rank ends the run here on every rank, with this step saved.
    double caught = double(caught_stop_signal());
    world_.all_reduce_max(&caught, 1);
    if (caught > 0.0) {
      stopped_by = int(caught);
      stopped_at = step;
      stopping = true;
    }
    if ((cfg_.save_every > 0 && step % cfg_.save_every == 0) || last || stopping)
      last_checkpoint = save(step);
    if (stopping) break;
  }
  if (cfg_.steps <= start_step_ && early_stop_step < 0) last_checkpoint = save(start_step_);
  checkpointer_->finish();  // an --async-save still writing: wait for it, then commit it
  last_checkpoint = checkpointer_->last_committed();
  if (stopped_by) {  // the shell's code for a process a signal ended: 128 + its number
    if (lead_)
      fmt::print(stderr,
                 "trellis: {} stopped the run after step {}: checkpoint {} (train again with "
                 "--resume to continue from it)\n",
                 stopped_by == SIGINT ? "SIGINT" : "SIGTERM", stopped_at, last_checkpoint);
    return 128 + stopped_by;
  }
  if (!lead_ || cfg_.quiet) return 0;
  const int64_t end_step = early_stop_step >= 0         ? early_stop_step
                           : cfg_.stop_at > start_step_ ? std::min(cfg_.stop_at, cfg_.steps)
                                                        : cfg_.steps;
  if (best_.best_step() >= 0)
    fmt::print("trellis: best {} {:.4f} at step {}: {}/best\n", best_.name(), best_.best_value(),
               best_.best_step(), cfg_.out);
  const int64_t trained = std::max<int64_t>(0, end_step - start_step_);
  const double mean_tps = timed_steps ? tokens_per_s_sum / double(timed_steps) : 0.0;
  fmt::print(
      "trellis: done | {} steps, {} tokens in {} | mean {:.0f} tok/s, MFU {:.1f}% of {:.0f} "
      "GFLOP/s/core ({}){} | checkpoint {} | metrics {}/metrics.jsonl{}\n",
      trained, trained * G_ * T_, format_duration(seconds_since(run_start_)), mean_tps,
      100.0 * mean_tps / double(G_ * T_) * step_flops_ / peak_flops_, peak_per_core_,
      cfg_.peak_gflops_per_core > 0 ? "peak_gflops_per_core" : peak_name(compute_),
      std::isfinite(best_val) ? fmt::format(" | best val loss {:.4f}", best_val) : "",
      last_checkpoint.empty() ? "(none)" : last_checkpoint, cfg_.out,
      cfg_.tensorboard ? fmt::format(" | tensorboard --logdir {}/tb", cfg_.out) : "");
  return 0;
}

}  // namespace

int dry_run(const TrainConfig& cfg, bool json) {
  TRELLIS_REQUIRE(cfg.layout.empty(),
                  "--dry-run predicts the layout given; for layout auto, `trellis plan` shows "
                  "every layout and which one auto takes");
  const RunData data = load_run_data(cfg);
  // One process predicts every rank of the layout cfg names (dp 0: one replica).
  const int64_t world = int64_t(cfg.dp > 0 ? cfg.dp : 1) * cfg.tp * cfg.pp;
  const RunShape run = validate_run(cfg, int(std::clamp<int64_t>(world, 0, INT_MAX)), data);
  const std::vector<RankMemory> ranks = predict_memory(run);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const RankMemory& m : ranks)
      out.push_back({{"rank", m.rank},           {"dp_rank", m.dp_rank},
                     {"tp_rank", m.tp_rank},     {"pp_rank", m.pp_rank},
                     {"params", m.params},       {"grads", m.grads},
                     {"optimizer", m.optimizer}, {"shards", m.shards},
                     {"weight_copies", m.weight_copies}, {"model_states", m.model_states()},
                     {"buffers", m.buffers}, {"activations", m.activations},
                     {"contexts", m.contexts}, {"workspace", m.workspace},
                     {"total", m.total()}});
    fmt::print("{}\n", out.dump(1));
    return 0;
  }
  auto mib = [](int64_t b) { return double(b) / (1 << 20); };
  fmt::print("trellis: dry run: {} ({:.2f}M parameters) | dp {}, tp {}{}, pp {}, zero {}, recompute "
             "{} | micro-batch {} x {} tokens, {} micro-batches\n",
             cfg.model, double(ParamLayout(run.model).count()) / 1e6, run.dp, run.tp,
             run.sequence_parallel ? " + sequence parallel" : "", run.pp, run.zero,
             recompute_name(run.recompute), run.micro_batch, run.seq_len, run.accum);
  fmt::print(
      "{:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>12} {:>10} {:>10}   (MiB)\n",
      "rank", "dp/tp/pp", "params", "grads", "optimizer", "shards", "bf16 copies", "buffers",
      "activations", "workspace", "total");
  for (const RankMemory& m : ranks)
    fmt::print(
        "{:>5} {:>9} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>11.1f} {:>10.1f} {:>12} {:>10.1f} "
        "{:>10.1f}\n",
        m.rank, fmt::format("{}/{}/{}", m.dp_rank, m.tp_rank, m.pp_rank), mib(m.params),
        mib(m.grads), mib(m.optimizer), mib(m.shards), mib(m.weight_copies), mib(m.buffers),
        fmt::format("{:.1f} ({}x)", mib(m.activations), m.contexts), mib(m.workspace),
        mib(m.total()));
  const auto top = std::max_element(ranks.begin(), ranks.end(), [](auto& a, auto& b) {
    return a.total() < b.total();
  });
  fmt::print("trellis: predicted peak of the largest rank: {:.1f} MiB (rank {}); training reports "
             "the measured one as alloc_peak_bytes_max in metrics.jsonl\n",
             mib(top->total()), top->rank);
  return 0;
}

int run_training(TrainConfig cfg, Communicator& world) {
  TRELLIS_REQUIRE(cfg.layout.empty() || cfg.layout == "auto",
                  "layout must be auto or empty, not '{}'", cfg.layout);
  RunData data = load_run_data(cfg);  // once: layout auto plans for its model and seq_len
  resolve_epochs(cfg, data);
  if (cfg.layout == "auto") cfg = choose_auto_layout(std::move(cfg), data, world);
  const RunShape shape = validate_run(cfg, world.size(), data);
  Trainer trainer(std::move(cfg), world, std::move(data), shape);
  return trainer.run();
}

}  // namespace trellis
