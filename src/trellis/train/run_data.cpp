#include "trellis/train/run_data.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <filesystem>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/examples.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/data/tokenizer.h"

namespace trellis {

namespace {

// A SentencePiece run copies its data's tokenizer.model into every checkpoint: read once here,
// and checked against the vocabulary (and the task's special token) the data was encoded for.
void load_sentencepiece(TokenizerInfo& info, int vocab_size, int special_token) {
  const std::string path = (std::filesystem::path(info.dir) / kSentencePieceFile).string();
  info.model = read_file(path);
  const auto tok = make_sentencepiece_tokenizer(info.model, path);
  const SpecialToken want =
      special_token >= 0 ? task_special_token(*tok) : SpecialToken{-1, tok->vocab_size()};
  TRELLIS_REQUIRE(want.vocab_size == vocab_size && want.id == special_token,
                  "{}: a model of {} pieces, which gives vocab_size {} (special token {}), but "
                  "meta.json beside it says vocab_size {} (special token {})",
                  path, tok->vocab_size(), want.vocab_size, want.id, vocab_size, special_token);
  info.vocab = tok->vocab_size();
  info.dir.clear();  // checkpoints record none: their own copy is the tokenizer
}

// patch_context needs images whose sizes meta.json records (meta: null for language-model data).
void check_patch_context(const TrainConfig& cfg, const TaskMeta* meta) {
  const bool images = meta && meta->feature_dim > 0 && meta->image_height > 0;
  const char* holds = !meta                  ? "language-model shards"
                      : meta->feature_dim > 0 ? "images without their sizes (prepare the data again)"
                                              : "token examples";
  TRELLIS_REQUIRE(cfg.patch_context == 0 || images,
                  "config key 'patch_context' needs images whose sizes meta.json records "
                  "(`trellis prepare --task classify` of an idx directory); {} holds {}",
                  cfg.data.empty() ? "the built-in corpus" : cfg.data, holds);
}

}  // namespace

RunData load_run_data(const TrainConfig& cfg) {
  RunData d;
  const bool task_dir = !cfg.data.empty() && is_task_dir(cfg.data);
  const std::string task = task_dir ? read_task_meta(cfg.data).task : "lm";
  TRELLIS_REQUIRE(cfg.task.empty() || cfg.task == task,
                  "task {} needs data from `trellis prepare --task {}`; {} holds {}", cfg.task,
                  cfg.task, cfg.data.empty() ? "the built-in corpus" : cfg.data,
                  task == "lm" ? "language-model shards" : task + " examples");
  if (!task_dir) {
    check_augment(cfg.augment, nullptr, cfg.data);
    check_patch_context(cfg, nullptr);
    d.lm = cfg.data.empty() ? default_mixture() : load_mixture(cfg.data);
    d.tokenizer = {d.lm.tokenizer, d.lm.tokenizer_dir};
    if (d.tokenizer.kind == "sentencepiece") load_sentencepiece(d.tokenizer, d.lm.vocab_size, -1);
    d.model = cfg.model_config(d.lm.vocab_size);
    d.T = cfg.seq_len > 0 ? cfg.seq_len : d.model.block_size;
    TRELLIS_REQUIRE(d.T <= d.model.block_size, "seq_len {} exceeds the model's context length {}",
                    d.T, d.model.block_size);
    return d;
  }
  d.task = std::make_unique<TaskData>(load_task_data(cfg.data));
  const TaskMeta& meta = d.task->meta;
  d.augment = check_augment(cfg.augment, &meta, cfg.data);
  d.tokenizer = {meta.tokenizer, meta.tokenizer_dir};
  if (d.tokenizer.kind == "sentencepiece")
    load_sentencepiece(d.tokenizer, meta.vocab_size, meta.special_token);
  const bool classify = task == "classify";
  check_patch_context(cfg, &meta);
  d.model = cfg.model_config(meta.vocab_size, classify ? int(meta.classes.size()) : 0,
                             SequenceFormat(meta, 0, cfg.patch_context).input_features());
  TRELLIS_REQUIRE(classify != d.model.encoder_decoder(), "model {}: {} needs {}", cfg.model, task,
                  classify ? "an encoder or a decoder (encoder-*, gpt2*, llama*), not an "
                             "encoder-decoder"
                           : "an encoder-decoder (seq2seq-*, transformer-base, encdec-*)");
  const int64_t needed = task_seq_len(*d.task);
  d.T = cfg.seq_len > 0 ? cfg.seq_len : std::min<int64_t>(needed, d.model.block_size);
  TRELLIS_REQUIRE(d.T <= d.model.block_size, "seq_len {} exceeds the model's context length {}",
                  d.T, d.model.block_size);
  TRELLIS_REQUIRE(classify || needed <= d.T,
                  "{}: the longest translation pair needs {} positions (with its end token), more "
                  "than seq_len {}; raise seq_len (and block_size) or prepare with a smaller "
                  "--max-len",
                  cfg.data, needed, d.T);
  TRELLIS_REQUIRE(meta.feature_dim == 0 || needed <= d.T,
                  "{}: images have {} patches, more than seq_len {}", cfg.data, needed, d.T);
  return d;
}

void resolve_epochs(TrainConfig& cfg, const RunData& d) {
  for (auto [key, value] : {std::pair{"epochs", cfg.epochs}, {"val_per_epoch", cfg.val_per_epoch}}) {
    TRELLIS_REQUIRE(value >= 0.0 && std::isfinite(value), "config key '{}': {} must be >= 0",
                    key, value);
    TRELLIS_REQUIRE(value == 0.0 || d.task,
                    "config key '{}' counts passes over a task's training examples; {} is a "
                    "language model's corpus: give steps and val_every instead",
                    key, cfg.data.empty() ? "the built-in corpus" : cfg.data);
  }
  if (!d.task || cfg.batch_size <= 0) return;  // batch_size's own check names it
  const double per_epoch = double(d.task->train.size()) / double(cfg.batch_size);
  if (cfg.epochs > 0.0) cfg.steps = std::max<int64_t>(1, int64_t(std::ceil(cfg.epochs * per_epoch)));
  if (cfg.val_per_epoch > 0.0)
    cfg.val_every = std::max<int64_t>(1, std::llround(per_epoch / cfg.val_per_epoch));
}

}  // namespace trellis
