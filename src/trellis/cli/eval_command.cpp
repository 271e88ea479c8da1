// `trellis eval` (mean loss of a checkpoint on fixed windows of a shard; for a task checkpoint,
// its metrics on a task directory's validation split) and `trellis grad` (the loss of one batch
// and its gradients, written as safetensors: the PyTorch oracle compares them).
#include <omp.h>

#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "trellis/cli/commands.h"
#include "trellis/cli/ensemble.h"
#include "trellis/cli/local_model.h"
#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/loader.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/data/shard.h"
#include "trellis/data/tokenizer.h"
#include "trellis/eval/bleu.h"
#include "trellis/eval/classification.h"
#include "trellis/io/checkpoint.h"
#include "trellis/io/safetensors.h"
#include "trellis/kernels/isa.h"
#include "trellis/model/decode.h"
#include "trellis/model/model_chunk.h"
#include "trellis/train/batches.h"

namespace trellis {

namespace {

struct EvalArgs {
  std::vector<std::string> checkpoints;  // eval of a classifier: several are an ensemble
  std::string data, out;
  int64_t seq_len = 64, batch_size = 4, batches = 1;
  int threads = 0;
  std::string precision = "fp32";
  int beam = 1;
  int64_t max_len = 0, examples = 0;
  bool document_mask = false;
  bool no_cache = false;  // translation: decode without the key/value cache
  std::string tta;        // image classification: "flip" averages each image with its mirror
  // grad: dropout as a training step draws it (Context::dropout): the probabilities, the seed
  // and the global step; the batch's sequences are its global sequences 0, 1, ...
  float dropout = 0.0f, attn_dropout = 0.0f, classifier_dropout = 0.0f;
  uint64_t dropout_seed = 0;
  int64_t dropout_step = 0;
  float label_smoothing = 0.0f;  // grad: the training loss's (eval reports the plain loss)
  std::optional<bool> bf16_embeddings;  // grad: as training's key (unset: the checkpoint's)
};

void add_eval_options(CLI::App* sub, EvalArgs& a, bool ensemble) {
  sub->add_option("--checkpoint", a.checkpoints,
                  ensemble ? "checkpoint directory (OUT/step_NNNNNNNN or OUT/best); several "
                             "classifiers of the same task are evaluated as an ensemble (the mean "
                             "of their class probabilities)"
                           : "checkpoint directory (OUT/step_NNNNNNNN or OUT/best)")
      ->required()
      ->expected(1, ensemble ? 1 << 16 : 1);
  sub->add_option("--data", a.data,
                  "token shard (.bin, llm.c format), or for a task checkpoint the task directory "
                  "from `trellis prepare --task`")
      ->required();
  sub->add_option("--seq-len", a.seq_len, "tokens per window")->capture_default_str();
  sub->add_option("--batch-size", a.batch_size,
                  "windows per batch (a task directory: examples per batch, and sentences "
                  "translated together)")
      ->capture_default_str();
  sub->add_option("--threads", a.threads, "OpenMP threads (0 = all cores)");
  sub->add_flag("--document-mask", a.document_mask,
                "token shard: attention stays inside each document (the shard's .idx document "
                "index), positions restart per document, as in training with document_mask");
  sub->add_option("--precision", a.precision,
                  "GEMM precision: fp32, bf16 (bf16 operands, fp32 accumulation) or auto")
      ->capture_default_str();
}

// The GEMM precision of a.precision on this CPU (a bf16 request on a CPU without AVX512-BF16
// says that its matrix products are emulated).
DType compute_precision(const EvalArgs& a) {
  const Precision p = choose_precision(a.precision);
  static bool noticed = false;
  if (!p.notice.empty() && !noticed) fmt::print(stderr, "trellis: {}\n", p.notice);
  noticed = true;
  return p.compute;
}

// Mean loss over windows [0, rows) (window i = tokens [i*T, i*T+T], targets shifted by one);
// with grads != nullptr also accumulates the gradient of that mean into grads.
double windows_loss(const EvalArgs& a, int64_t rows, bool with_grad, CheckpointData& ck,
                    std::vector<float>* grads) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  TRELLIS_REQUIRE(a.seq_len >= 1 && a.batch_size >= 1, "seq-len and batch-size must be >= 1");
  TRELLIS_REQUIRE(a.seq_len <= ck.model.block_size,
                  "seq-len {} exceeds the checkpoint's context length {}", a.seq_len,
                  ck.model.block_size);
  TokenStream tokens = TokenStream::map_files({a.data});
  tokens.set_vocab(ck.model.vocab_size);
  LocalModel local(ck, grads ? grads->data() : nullptr, compute_precision(a));
  ModelChunk& model = local.model;
  model.set_label_smoothing(a.label_smoothing);
  Context ctx;
  model.prepare(ctx, a.batch_size, a.seq_len);
  if (a.document_mask) {
    TRELLIS_REQUIRE(tokens.has_doc_index(),
                    "{}: not found: --document-mask needs the document "
                    "index `trellis prepare` writes beside the shard",
                    tokens.missing_doc_index());
    ctx.doc_start.assign(size_t(a.batch_size * a.seq_len), 0);
  }
  double sum = 0.0;
  const float scale = with_grad ? 1.0f / float(rows * a.seq_len) : 0.0f;
  for (int64_t w = 0; w < rows; w += a.batch_size) {
    TRELLIS_CHECK(w + a.batch_size <= rows, "rows must be a multiple of the batch size");
    fill_eval_windows(tokens, a.seq_len, w, a.batch_size, ctx.tokens.data(), ctx.targets.data());
    for (int64_t r = 0; a.document_mask && r < a.batch_size; ++r)
      window_doc_starts(tokens, a.seq_len, w + r, ctx.doc_start.data() + r * a.seq_len);
    ctx.dropout = {with_grad, a.dropout_seed, a.dropout_step, w};
    sum += model.forward(ctx, scale);
    if (with_grad) model.backward(ctx, true);
  }
  return sum / double(rows * a.seq_len);
}

// Loss of examples [0, n) of `set` in batches of a.batch_size (mean over their targets); with
// grads, the gradient of that mean accumulates there.
double examples_loss(const EvalArgs& a, CheckpointData& ck, const SequenceFormat& f,
                     const ExampleSet& set, int64_t n, std::vector<float>* grads) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  LocalModel local(ck, grads ? grads->data() : nullptr, compute_precision(a));
  ModelChunk& model = local.model;
  model.set_label_smoothing(a.label_smoothing);
  Context ctx;
  model.prepare(ctx, a.batch_size, f.T);
  int64_t targets = 0;
  for (int64_t i = 0; i < n; ++i) targets += f.targets(set.target(size_t(i)));
  const float scale = grads ? 1.0f / float(targets) : 0.0f;
  double sum = 0.0;
  for (int64_t first = 0; first < n; first += a.batch_size) {
    const int64_t rows = std::min(a.batch_size, n - first);
    for (int64_t r = 0; r < a.batch_size; ++r) {
      const size_t i = size_t(first + r);
      if (r < rows)
        f.put(ctx, r, set.source(i), set.target(i), set.labels[i]);
      else
        f.put_padding(ctx, r);
    }
    ctx.dropout = {grads != nullptr, a.dropout_seed, a.dropout_step, first};
    sum += model.forward(ctx, scale);
    if (grads) model.backward(ctx, true);
  }
  return sum / double(targets);
}

// A task checkpoint on a task directory's validation split: classification metrics (of several
// classifiers: of their ensemble), or the translation loss with BLEU and chrF of its
// translations.
nlohmann::json evaluate_task(const EvalArgs& a) {
  const TaskData d = load_task_data(a.data);
  const int64_t n = a.examples > 0 ? std::min<int64_t>(a.examples, d.val.size()) : d.val.size();
  TRELLIS_REQUIRE(n > 0, "{}: val.examples holds no examples", a.data);
  const std::vector<std::string> members = expand_ensembles(a.checkpoints);
  TRELLIS_REQUIRE(d.meta.task == "classify" || members.size() == 1,
                  "{} checkpoints: an ensemble is of classifiers, {} holds {} examples",
                  members.size(), a.data, d.meta.task);
  const bool flip = a.tta == "flip";
  TRELLIS_REQUIRE(!flip || d.meta.feature_dim > 0,
                  "--tta flip mirrors images; {} holds {} examples of tokens", a.data, d.meta.task);
  TRELLIS_REQUIRE(!flip || d.meta.image_height > 0,
                  "--tta flip: {}/meta.json does not record the image and patch sizes (prepared "
                  "by an older trellis): prepare the data again",
                  a.data);
  if (d.meta.task == "classify") {
    if (a.threads > 0) omp_set_num_threads(a.threads);
    nlohmann::json j =
        ensemble_validation(members, d, n, a.batch_size, compute_precision(a), flip).to_json();
    j.erase("confusion");
    if (members.size() > 1) j["members"] = members.size();
    if (flip) j["tta"] = a.tta;
    return j;
  }
  CheckpointData ck = load_checkpoint(members[0], false);
  const SequenceFormat f = task_format(ck, d.meta, a.data);
  const double loss = examples_loss(a, ck, f, d.val, n, nullptr);
  // The checkpoint's own tokenizer: the data must be encoded with it (task_format).
  auto tok = load_checkpoint_tokenizer(ck);
  LocalModel local(ck, nullptr, compute_precision(a));
  ModelChunk& model = local.model;
  const DecodeOptions opt{a.beam, a.max_len, 0.6, f.special, f.T, !a.no_cache};
  std::vector<std::string> hyps, refs;
  for (int64_t first = 0; first < n; first += a.batch_size) {
    std::vector<std::span<const uint32_t>> sources;
    for (int64_t i = first; i < std::min(n, first + a.batch_size); ++i) {
      sources.push_back(d.val.source(size_t(i)));
      const auto target = d.val.target(size_t(i));
      refs.push_back(tok->decode(std::vector<int>(target.begin(), target.end())));
    }
    for (const auto& out : translate(model, sources, opt)) hyps.push_back(tok->decode(out));
  }
  return {{"loss", loss},
          {"bleu", corpus_bleu(hyps, {refs}).score},
          {"chrf", corpus_chrf(hyps, {refs})},
          {"examples", n},
          {"beam", a.beam}};
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "mean loss of a checkpoint on a token shard");
  add_eval_options(sub, *a, true);
  sub->add_option("--batches", a->batches, "number of batches")->capture_default_str();
  sub->add_option("--beam", a->beam, "translation: beam size (1 = greedy)")->capture_default_str();
  sub->add_option("--max-len", a->max_len, "translation: most generated tokens (0 = the context)");
  sub->add_flag("--no-cache", a->no_cache,
                "translation: decode without the key/value cache (same BLEU, slower)");
  sub->add_option("--examples", a->examples,
                  "task directory: evaluate the first N validation examples (0 = all)");
  sub->add_option("--tta", a->tta,
                  "image classification: test-time augmentation; flip = the mean of each "
                  "image's class probabilities and its left-right mirror's");
  return {sub, [a](Communicator&) {
            TRELLIS_REQUIRE(a->batches >= 1, "--batches must be >= 1");
            TRELLIS_REQUIRE(a->beam >= 1, "--beam must be >= 1");
            TRELLIS_REQUIRE(a->tta.empty() || a->tta == "flip",
                            "--tta '{}': unknown test-time augmentation (flip is the one there is)",
                            a->tta);
            if (is_task_dir(a->data)) {
              fmt::print("{}\n", evaluate_task(*a).dump());
              return 0;
            }
            TRELLIS_REQUIRE(a->tta.empty(), "--tta {} mirrors images; {} is a token shard", a->tta,
                            a->data);
            const std::vector<std::string> members = expand_ensembles(a->checkpoints);
            TRELLIS_REQUIRE(members.size() == 1,
                            "{} checkpoints: an ensemble is of classifiers, {} is a token shard",
                            members.size(), a->data);
            CheckpointData ck = load_checkpoint(members[0], false);
            const int64_t rows = a->batches * a->batch_size;
            const double loss = windows_loss(*a, rows, false, ck, nullptr);
            fmt::print(
                "{}\n",
                nlohmann::json{{"loss", loss}, {"windows", rows}, {"tokens", rows * a->seq_len}}
                    .dump());
            return 0;
          }};
}

Command add_grad_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "grad", "loss and parameter gradients of one batch, as safetensors (for checking)");
  add_eval_options(sub, *a, false);
  sub->add_option("--out", a->out, "output .safetensors file")->required();
  sub->add_option("--dropout", a->dropout, "dropout (as training's key) of this batch");
  sub->add_option("--attn-dropout", a->attn_dropout, "attention dropout of this batch");
  sub->add_option("--classifier-dropout", a->classifier_dropout,
                  "classifier dropout of this batch");
  sub->add_option("--dropout-seed", a->dropout_seed, "the run seed the masks are drawn from");
  sub->add_option("--dropout-step", a->dropout_step, "the global step (0-based) of the masks");
  sub->add_option("--label-smoothing", a->label_smoothing,
                  "label smoothing in [0, 1) of the loss and gradients, as training's "
                  "label_smoothing")
      ->capture_default_str();
  sub->add_option("--bf16-embeddings", a->bf16_embeddings,
                  "true|false: with --precision bf16, look the embedding tables up in bf16, as "
                  "training's bf16_embeddings (default: as the checkpoint was trained)");
  return {sub, [a](Communicator&) {
            TRELLIS_REQUIRE(a->label_smoothing >= 0.0f && a->label_smoothing < 1.0f,
                            "--label-smoothing {} is outside [0, 1)", a->label_smoothing);
            CheckpointData ck = load_checkpoint(a->checkpoints[0], false);
            ck.model.dropout = a->dropout;
            ck.model.attn_dropout = a->attn_dropout;
            ck.model.classifier_dropout = a->classifier_dropout;
            if (a->bf16_embeddings) ck.model.bf16_embeddings = *a->bf16_embeddings;
            ck.model.validate();  // the probabilities in [0, 1)
            const ParamLayout layout(ck.model);
            std::vector<float> grads(layout.size(), 0.0f);
            double loss = 0.0;
            if (is_task_dir(a->data)) {  // the first batch_size training examples
              const TaskData d = load_task_data(a->data);
              const SequenceFormat f = task_format(ck, d.meta, a->data);
              TRELLIS_REQUIRE(int64_t(d.train.size()) >= a->batch_size,
                              "{}: fewer than {} training examples", a->data, a->batch_size);
              loss = examples_loss(*a, ck, f, d.train, a->batch_size, &grads);
            } else {
              loss = windows_loss(*a, a->batch_size, true, ck, &grads);
            }
            std::vector<TensorRef> refs;
            for (const auto& s : layout.specs()) {
              TensorRef r{s.name, s.shape, grads.data() + s.offset};
              if (s.export_rows >= 0) r.shape[0] = s.export_rows;
              refs.push_back(r);
            }
            write_safetensors(a->out, refs, {{"loss", fmt::format("{:.17g}", loss)}});
            fmt::print("{}\n", nlohmann::json{{"loss", loss}}.dump());
            return 0;
          }};
}

}  // namespace trellis
