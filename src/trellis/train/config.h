#pragma once
// Every training setting has one home here, with its default. The key registry below gives each
// a name and help text; the TOML file, --set key=value and the command-line flags all go
// through it, so --help and --dump-config list exactly these keys.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trellis/model/config.h"
#include "trellis/optim/optimizer.h"

namespace trellis {

// The defaults are the default job's recipe (README command 1, measured by bench/default_job.py):
// the `mini` model on the built-in corpus, 440 steps of 32 x 128 bytes at a peak lr of 4e-3 after
// the default warmup. Larger models want a lower lr (GPT-2 124M: 6e-4).
struct TrainConfig {
  // model
  std::string model = "mini";
  int n_layer = 0, n_dec_layer = 0, n_head = 0, n_kv_head = 0;  // 0 = the preset's value
  int n_embd = 0, ffn_hidden = 0, block_size = 0;
  // Block choices; empty = the family's (norm: layernorm|rmsnorm, positions: learned|rope,
  // mlp: gelu|swiglu, bias and tied_head: true|false).
  std::string norm, positions, mlp, bias, tied_head;
  int vocab_multiple = 64;
  // Dropout probabilities in [0, 1), inverted, training forwards only (ModelConfig's, which
  // model_config copies them into): embedding output and residual branches; attention
  // probabilities; a classifier's pooled vector.
  double dropout = 0.0, attn_dropout = 0.0, classifier_dropout = 0.0;
  // fastText-style subword features of an encoder over GPT-2 tokens: the n-gram table's rows
  // (0 = off) and the n-gram lengths (ModelConfig's; model/subword_ngrams.h).
  int subword_ngrams = 0, ngram_min = 2, ngram_max = 5;
  // A Hugging Face model directory to start from (fine-tuning); its config.json gives the model,
  // so the preset, sizes and block choices above stay unset.
  std::string init_from;
  // data
  // directory with train*.bin / val*.bin, or a mixture "A:0.7,B:0.3"; empty = default corpus
  std::string data;
  // lm | classify | translate; empty = the data's (a task directory names its task).
  std::string task;
  std::string pooling;  // a classifier's: mean | cls | last; empty = last for decoders, else mean
  // Label smoothing of the training loss in [0, 1) (LM, classification, translation); validation
  // reports the plain negative log-likelihood.
  double label_smoothing = 0.0;
  bool shuffle = true;
  // Keep attention inside each document of a packed window (the shards' document indexes);
  // positions restart per document.
  bool document_mask = false;
  // Image tasks: augmentation of the training examples, e.g. "shift:2,flip" (data/augment.h);
  // empty = none.
  std::string augment;
  // Image tasks: each patch's input also holds its neighbours up to this many patches away (an
  // overlapping patch embedding, train/batches.h SequenceFormat); 0 = the patch alone.
  int patch_context = 0;
  // run
  std::string out = "out";
  int64_t steps = 440;
  // Task data: passes over the training examples; > 0 sets steps to ceil(epochs x examples /
  // batch_size) once the data is loaded (resolve_epochs), so a recipe fits any data set's size.
  double epochs = 0.0;
  int64_t batch_size = 32;       // global, in sequences
  int64_t micro_batch_size = 0;  // per rank and micro-step; 0 = batch_size / dp (no accumulation)
  int64_t seq_len = 0;           // 0 = the model's context length
  uint64_t seed = 1337;
  int threads = 0;                 // OpenMP threads per rank; 0 = cores / local ranks
  std::string precision = "auto";  // GEMMs in fp32 | bf16 | auto (bf16 where the CPU has it)
  bool bf16_embeddings = false;    // bf16 lookups of the embedding tables (ModelConfig's)
  OptimConfig optim = {.lr = 4e-3f, .min_lr = 4e-4f};
  // checkpoints, validation, logging
  int64_t save_every = 0;   // 0 = only at the end
  bool async_save = false;  // write checkpoints from a background thread (a host snapshot)
  bool resume = false;
  int64_t stop_at = 0;      // save and exit after this step (a time-limited job); 0 = run all
  double time_budget = 0.0;  // minutes the run may take: fits steps to it (train/time_budget.h)
  int ensemble = 1;  // classifiers: members trained one after another (cli/ensemble.h)
  int64_t val_every = 110;  // 0 = only at the end
  double val_per_epoch = 0.0;  // task data: > 0 sets val_every to an epoch / val_per_epoch
  int64_t val_batches = 4;  // global batches of the validation split per evaluation
  // Keep OUT/best/, the checkpoint of the best validation so far: val_loss | val_accuracy |
  // val_macro_f1 (classifiers); empty = off (train/best.h).
  std::string keep_best;
  int64_t early_stop_patience = 0;  // stop after this many validations without improvement; 0 = off
  int64_t log_every = 1;
  bool quiet = false;
  bool tensorboard = true;
  double peak_gflops_per_core = 0.0;  // the per-core peak behind MFU; 0 = probe it at start
  // parallelism
  std::string layout;             // "auto": the planner picks everything below (train/auto_layout)
  std::string machine;            // with layout auto: a machine file; empty = calibrate at start
  int dp = 0, tp = 1, pp = 1;     // dp = 0: world / (tp * pp)
  std::string schedule = "1f1b";  // pipeline schedule: gpipe | 1f1b | interleaved
  int virtual_stages = 1;         // model chunks per pipeline rank (interleaved)
  std::string layer_split;        // blocks per pipeline chunk, e.g. "3,1"; empty = balanced
  std::string trace;              // write a Chrome trace of the first trace_steps steps here
  int64_t trace_steps = 3;
  bool sequence_parallel = false;  // split LayerNorm/residual regions along the sequence (tp > 1)
  // What a training forward keeps for backward: none | selective | full (model/transformer.h).
  std::string recompute = "none";
  int zero = 0;                 // ZeRO stage 0-3 (parallel/zero.h)
  double bucket_mb = 25.0;      // gradient all-reduce bucket size
  std::string grad_reduce_dtype = "fp32";  // what gradients cross dp in: fp32 | bf16
  double comm_timeout = 300.0;  // seconds any rank waits in one communication before aborting

  // The configured model for a vocabulary; num_classes > 0 gives it a classifier (pooling from
  // `pooling`), input_features > 0 a projection of feature inputs.
  ModelConfig model_config(int vocab_size, int num_classes = 0, int input_features = 0) const;
};

struct ConfigKey {
  std::string name;
  std::string help;
  std::string type;                             // INT, FLOAT, BOOL or TEXT (for --help)
  std::function<void(const std::string&)> set;  // parses; input error naming the key if invalid
  std::function<std::string()> get;
};

std::vector<ConfigKey> config_keys(TrainConfig& c);
// Applies "key=value"; unknown key or bad value: input error.
void apply_setting(std::vector<ConfigKey>& keys, const std::string& key, const std::string& value);
// Loads a TOML file of top-level key = value pairs (tables [x] flatten to x.key; no such key
// exists so they error as unknown keys).
void apply_toml_file(std::vector<ConfigKey>& keys, const std::string& path);
// TOML text of every key and its current value.
std::string dump_config(std::vector<ConfigKey>& keys);

}  // namespace trellis
