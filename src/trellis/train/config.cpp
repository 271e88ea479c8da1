#include "trellis/train/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <charconv>

#include "trellis/core/error.h"
#include "trellis/io/pretrained.h"

namespace trellis {

namespace {

// The model of an init_from directory: its config.json's, vocabulary included (the embedding has
// its rows), which the data's must fit in.
ModelConfig pretrained_base(const TrainConfig& c, int vocab_size) {
  std::vector<std::string> set;
  const std::pair<const char*, bool> keys[] = {
      {"n_layer", c.n_layer != 0},         {"n_dec_layer", c.n_dec_layer != 0},
      {"n_head", c.n_head != 0},           {"n_kv_head", c.n_kv_head != 0},
      {"n_embd", c.n_embd != 0},           {"ffn_hidden", c.ffn_hidden != 0},
      {"block_size", c.block_size != 0},   {"norm", !c.norm.empty()},
      {"positions", !c.positions.empty()}, {"mlp", !c.mlp.empty()},
      {"bias", !c.bias.empty()},           {"tied_head", !c.tied_head.empty()}};
  for (const auto& [key, value] : keys)
    if (value) set.push_back(key);
  TRELLIS_REQUIRE(set.empty(),
                  "init_from {}: the model's sizes and blocks come from its config.json; leave {} "
                  "unset",
                  c.init_from, fmt::join(set, ", "));
  ModelConfig m = pretrained_model_config(c.init_from);
  TRELLIS_REQUIRE(vocab_size <= m.vocab_size,
                  "the data's vocabulary has {} tokens, more than the {} of the model in {} "
                  "(init_from): prepare the data with the model's tokenizer",
                  vocab_size, m.vocab_size, c.init_from);
  return m;
}

}  // namespace

ModelConfig TrainConfig::model_config(int vocab_size, int num_classes, int input_features) const {
  ModelConfig m = init_from.empty() ? model_preset(model) : pretrained_base(*this, vocab_size);
  if (n_layer) m.n_layer = n_layer;
  if (n_dec_layer) m.n_dec_layer = n_dec_layer;
  if (n_head) m.n_head = n_head;
  if (n_kv_head) m.n_kv_head = n_kv_head;
  if (n_embd) m.n_embd = n_embd;
  if (ffn_hidden) m.ffn_hidden = ffn_hidden;
  if (block_size) m.block_size = block_size;
  if (init_from.empty()) m.vocab_size = vocab_size;
  m.vocab_multiple = vocab_multiple;
  m.dropout = float(dropout);
  m.attn_dropout = float(attn_dropout);
  m.classifier_dropout = float(classifier_dropout);
  m.bf16_embeddings = bf16_embeddings;
  m.subword_ngrams = subword_ngrams;
  m.ngram_min = ngram_min;
  m.ngram_max = ngram_max;
  set_block_choices({{"norm", norm},
                     {"positions", positions},
                     {"mlp", mlp},
                     {"bias", bias},
                     {"tied_head", tied_head}},
                    m, "model");
  m.num_classes = num_classes;
  m.input_features = input_features;
  m.pooling = m.causal ? Pooling::Last : Pooling::Mean;
  set_block_choices({{"pooling", pooling}}, m, "model");
  m.validate();
  return m;
}

namespace {

template <class T>
T parse_number(const std::string& key, const std::string& v) {
  T out{};
  const char* end = v.data() + v.size();
  const std::from_chars_result r = std::from_chars(v.data(), end, out);  // floats: libstdc++ 11+
  TRELLIS_REQUIRE(r.ec == std::errc() && r.ptr == end && !v.empty(),
                  "config key '{}': '{}' is not a valid {}", key, v,
                  std::is_floating_point_v<T> ? "number" : "integer");
  return out;
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  TRELLIS_REQUIRE(false, "config key '{}': '{}' is not a boolean (true/false)", key, v);
  return false;
}

template <class T>
ConfigKey make_key(std::string name, std::string help, T* field) {
  ConfigKey k;
  k.name = name;
  k.help = std::move(help);
  if constexpr (std::is_same_v<T, std::string>)
    k.type = "TEXT";
  else if constexpr (std::is_same_v<T, bool>)
    k.type = "BOOL";
  else if constexpr (std::is_floating_point_v<T>)
    k.type = "FLOAT";
  else
    k.type = "INT";
  k.set = [name, field](const std::string& v) {
    if constexpr (std::is_same_v<T, std::string>)
      *field = v;
    else if constexpr (std::is_same_v<T, bool>)
      *field = parse_bool(name, v);
    else
      *field = parse_number<T>(name, v);
  };
  k.get = [field]() {
    if constexpr (std::is_same_v<T, std::string>)
      return *field;
    else if constexpr (std::is_same_v<T, bool>)
      return std::string(*field ? "true" : "false");
    else
      return fmt::format("{}", *field);
  };
  return k;
}

// k, refusing values outside [lo, hi) with an input error naming the key.
ConfigKey in_range(ConfigKey k, double lo, double hi) {
  k.set = [name = k.name, set = k.set, lo, hi](const std::string& v) {
    set(v);
    const double x = parse_number<double>(name, v);
    TRELLIS_REQUIRE(x >= lo && x < hi, "config key '{}': {} is outside [{}, {})", name, v, lo, hi);
  };
  return k;
}

}  // namespace

std::vector<ConfigKey> config_keys(TrainConfig& c) {
  OptimConfig& o = c.optim;
  return {
      make_key("model",
               "model preset: tiny, mini, baby, gpt2, gpt2-medium, gpt2-large, gpt2-xl (GPT-2), "
               "llama-tiny, llama-baby (LLaMA-style), encoder-tiny, encoder-baby (bidirectional), "
               "encdec-tiny, encdec-baby, seq2seq-tiny, seq2seq-baby, transformer-base "
               "(encoder-decoder)",
               &c.model),
      make_key("n_layer", "override the preset's number of blocks (0 = preset)", &c.n_layer),
      make_key("n_dec_layer",
               "override the preset's decoder blocks (encoder-decoder models; 0 = preset)",
               &c.n_dec_layer),
      make_key("n_head", "override the preset's attention heads (0 = preset)", &c.n_head),
      make_key("n_kv_head",
               "override the preset's key/value heads (grouped-query attention; 0 = preset)",
               &c.n_kv_head),
      make_key("n_embd", "override the preset's width (0 = preset)", &c.n_embd),
      make_key("ffn_hidden", "override the preset's MLP width (0 = preset)", &c.ffn_hidden),
      make_key("norm", "layernorm or rmsnorm (empty = the family's)", &c.norm),
      make_key("positions", "learned or rope (empty = the family's)", &c.positions),
      make_key("mlp", "gelu, swiglu or none (attention-only encoder; empty = the family's)",
               &c.mlp),
      make_key("bias", "linear layers with biases: true or false (empty = the family's)", &c.bias),
      make_key("tied_head",
               "output head tied to the token embedding: true or false (empty = the "
               "family's)",
               &c.tied_head),
      make_key("block_size", "override the preset's context length (0 = preset)", &c.block_size),
      in_range(make_key("dropout",
                        "dropout probability in [0, 1) of the embedding output (and an "
                        "encoder-decoder's decoder embedding) and of each residual branch (after "
                        "the attention, cross-attention and MLP output projections); inverted, "
                        "training only, masks independent of the layout (docs/training.md)",
                        &c.dropout),
               0.0, 1.0),
      in_range(make_key("attn_dropout",
                        "dropout probability in [0, 1) of the attention probabilities (self and "
                        "cross attention); training only",
                        &c.attn_dropout),
               0.0, 1.0),
      in_range(make_key("classifier_dropout",
                        "dropout probability in [0, 1) of a classifier's pooled vector, before "
                        "its head; training only",
                        &c.classifier_dropout),
               0.0, 1.0),
      in_range(make_key("subword_ngrams",
                        "fastText-style subword features (encoder over GPT-2 tokens): each "
                        "token's embedding plus the mean of the hashed character n-grams of its "
                        "word, from a table (embed_ngrams.weight) of this many rows; 0 = off "
                        "(docs/tasks.md)",
                        &c.subword_ngrams),
               0.0, double(kMaxVocab) + 1),
      make_key("ngram_min", "shortest subword n-gram, in characters (with subword_ngrams)",
               &c.ngram_min),
      make_key("ngram_max", "longest subword n-gram, in characters (with subword_ngrams)",
               &c.ngram_max),
      make_key("vocab_multiple", "pad the embedding rows to a multiple of this (speed only)",
               &c.vocab_multiple),
      make_key("init_from",
               "Hugging Face model directory to start from (model.safetensors or a sharded "
               "index, F32/F16/BF16); the model's sizes come from its config.json",
               &c.init_from),
      make_key("data",
               "data directory from `trellis prepare` (train*.bin, val*.bin), or a mixture "
               "DIR:WEIGHT,DIR:WEIGHT,... sampled by weight; empty = built-in corpus",
               &c.data),
      make_key("task",
               "lm (next-token prediction), classify or translate (`trellis prepare --task`); "
               "empty = what the data directory holds",
               &c.task),
      make_key("pooling",
               "how a classifier reduces a sequence: mean (of the real positions), cls (the "
               "first, a special token) or last (the last real one, as "
               "GPT2ForSequenceClassification); empty = last for decoders, mean for encoders",
               &c.pooling),
      in_range(make_key("label_smoothing",
                        "label smoothing e in [0, 1) of the training loss (LM, classification, "
                        "translation), as torch.nn.CrossEntropyLoss(label_smoothing=e): the target "
                        "keeps 1 - e, e is spread evenly over all classes (the true vocabulary); "
                        "the logged training loss is the smoothed one, validation losses the "
                        "plain negative log-likelihood",
                        &c.label_smoothing),
               0.0, 1.0),
      make_key("shuffle", "shuffle training windows/examples each epoch (seeded)", &c.shuffle),
      make_key("document_mask",
               "language models: attention stays inside each document of a packed window (a "
               "block-diagonal causal mask from the document index `prepare` writes beside each "
               "shard), and positions (learned or RoPE) restart at each document",
               &c.document_mask),
      make_key("augment",
               "image tasks: augment the training examples (never validation, eval or "
               "classify), a comma-separated list of shift:N (translate by up to N pixels in y "
               "and x, each uniform in [-N, N], zero fill) and flip (horizontal, probability "
               "1/2), e.g. shift:2,flip; each example's draw is a function of (seed, epoch, "
               "example); empty = none",
               &c.augment),
      in_range(make_key("patch_context",
                        "image tasks: each patch's input also holds the patches up to this many "
                        "rows and columns away (zeros off the image), projected by the same "
                        "linear layer: an overlapping patch embedding, as a convolution of kernel "
                        "(2c+1)P, stride P, zero padding cP; 0 = the patch alone",
                        &c.patch_context),
               0, 4),
      make_key("out",
               "output directory: metrics.jsonl, tb/, step_NNNNNNNN/ checkpoints (and best/ with "
               "keep_best)",
               &c.out),
      make_key("steps", "number of optimizer steps", &c.steps),
      make_key("time_budget",
               "minutes the whole run may take: after its first 22 steps trellis times them and "
               "ends the run at the last step that fits (steps/epochs stay the most it trains), "
               "so the learning-rate schedule ends there too; evaluation counted, checkpoints not; "
               "0 = off",
               &c.time_budget),
      make_key("ensemble",
               "classification: train this many members one after another (seeds seed, seed+1, "
               "...; out/member_K) and report the ensemble, the mean of their class "
               "probabilities, in out/ensemble.json, which eval and classify take as "
               "--checkpoint out; under time_budget another member starts only while the minutes "
               "left fit the last one's time; 1 = one model",
               &c.ensemble),
      make_key("epochs",
               "task data: passes over the training examples; > 0 sets steps to ceil(epochs x "
               "examples / batch_size) (a --steps on the command line wins over a file's epochs)",
               &c.epochs),
      make_key("batch_size",
               "global batch size in sequences (all DP ranks and micro-steps together)",
               &c.batch_size),
      make_key("micro_batch_size",
               "sequences per rank per micro-step (0 = batch_size/dp, no accumulation)",
               &c.micro_batch_size),
      make_key("seq_len",
               "tokens per sequence (0 = the model's context length; for a task, the longest "
               "example up to it). Longer classification texts are truncated; translation pairs "
               "longer than seq_len are refused",
               &c.seq_len),
      make_key("seed", "seed of initialisation and data order", &c.seed),
      make_key("threads", "OpenMP threads per rank (0 = cores / ranks on this node)", &c.threads),
      make_key("precision",
               "GEMM precision: fp32; bf16 (operands rounded to bf16, fp32 accumulation, weights, "
               "optimizer and everything else fp32; without AVX512-BF16 the products are emulated, "
               "slower than fp32, with a notice); auto = bf16 where the CPU has it",
               &c.precision),
      make_key("bf16_embeddings",
               "with precision bf16: the lookups of the embedding tables (token, learned "
               "position, decoder position, subword n-gram) read them rounded to bf16, as the "
               "GEMMs read the weights (fp32 rows out), so ZeRO keeps no fp32 copy of them on "
               "every rank; saved in the checkpoint; no effect in fp32",
               &c.bf16_embeddings),
      make_key("optimizer", "adamw or sgd", &o.name),
      make_key("lr", "peak learning rate", &o.lr),
      make_key("lr_schedule",
               "after warmup: cosine or linear (decay from lr to min_lr at the last step), "
               "constant, or inverse_sqrt (lr * sqrt(warmup / step), the Transformer paper's)",
               &o.lr_schedule),
      make_key("min_lr", "learning rate at the end of the cosine or linear decay", &o.min_lr),
      make_key("warmup_steps",
               "linear warmup steps from 0 to lr (-1 = a tenth of the steps, at most 2000)",
               &o.warmup_steps),
      make_key("beta1", "AdamW beta1", &o.beta1),
      make_key("beta2", "AdamW beta2", &o.beta2),
      make_key("eps", "AdamW epsilon", &o.eps),
      make_key("weight_decay", "weight decay (decoupled for AdamW; 2-D weights only)",
               &o.weight_decay),
      make_key("momentum", "SGD momentum", &o.momentum),
      make_key("grad_clip", "clip the global gradient norm to this (0 = off)", &o.grad_clip),
      make_key("save_every", "write a checkpoint every N steps (0 = only at the end)",
               &c.save_every),
      make_key("async_save",
               "write checkpoints from a background thread while training goes on (the state "
               "is copied to host memory first; metrics.jsonl reports the stall)",
               &c.async_save),
      make_key("resume", "continue from the newest checkpoint in out", &c.resume),
      make_key("stop_at",
               "save a checkpoint and exit after this step; resume later (0 = run all steps)",
               &c.stop_at),
      make_key("val_every", "validation loss every N steps (0 = only at the end)", &c.val_every),
      make_key("val_per_epoch",
               "task data: validations per epoch; > 0 sets val_every (a --val-every on the "
               "command line wins over a file's val_per_epoch)",
               &c.val_per_epoch),
      make_key("val_batches", "global batches of validation data per evaluation", &c.val_batches),
      make_key("keep_best",
               "keep out/best/, the checkpoint of the best validation so far by val_loss, "
               "val_accuracy or val_macro_f1 (the last two for classifiers); rewritten "
               "atomically at each validation that improves it; empty = off",
               &c.keep_best),
      make_key("early_stop_patience",
               "with keep_best: stop training (with a final checkpoint) after this many "
               "validations in a row without improvement (0 = never stop early)",
               &c.early_stop_patience),
      make_key("log_every", "print a progress line every N steps", &c.log_every),
      make_key("quiet", "no progress lines (files are still written)", &c.quiet),
      make_key("tensorboard", "write TensorBoard event files to out/tb", &c.tensorboard),
      make_key("peak_gflops_per_core",
               "per-core peak GFLOP/s that MFU divides by (0 = measure the peak of the precision in "
               "use at start: fp32 FMA or bf16 dot products)",
               &c.peak_gflops_per_core),
      make_key("layout",
               "auto: take `trellis plan`'s first layout for this model, batch and world (dp, tp, "
               "pp, schedule, virtual stages, ZeRO, recompute, sequence parallelism, micro-batch; "
               "leave those unset); empty = as given",
               &c.layout),
      make_key("machine",
               "with layout auto: the machine file to plan on (`trellis calibrate`, hardware/); "
               "empty = calibrate this machine at start (about 2 s)",
               &c.machine),
      make_key("dp", "data-parallel size (0 = world / (tp*pp))", &c.dp),
      make_key("tp", "tensor-parallel size (must divide the number of heads)", &c.tp),
      make_key("pp", "pipeline-parallel size (stages)", &c.pp),
      make_key("schedule",
               "pipeline schedule: gpipe, 1f1b, interleaved or zb1 (zero-bubble ZB-H1: pp >= 2, "
               "recompute none)",
               &c.schedule),
      make_key("virtual_stages", "model chunks per pipeline rank (interleaved schedule)",
               &c.virtual_stages),
      make_key("layer_split", "blocks per pipeline chunk, e.g. 3,1 (empty = balanced)",
               &c.layer_split),
      make_key("trace",
               "write a Chrome trace (Perfetto) of the first trace_steps steps to this file",
               &c.trace),
      make_key("trace_steps", "steps recorded in the trace", &c.trace_steps),
      make_key("sequence_parallel",
               "with tp > 1: split LayerNorm/residual activations along the sequence",
               &c.sequence_parallel),
      make_key("recompute",
               "activation recomputation: none (keep every activation), selective (drop the MLP's "
               "up projection and activation, recompute them in backward) or full (keep only each "
               "block's input, rerun the block in backward); "
               "bitwise the same results",
               &c.recompute),
      make_key("zero",
               "ZeRO stage over dp: 0 (replicated), 1 (shard optimizer state), 2 (and "
               "gradients, reduced per block), 3 (and parameters, gathered per block); 2 and 3 "
               "without pp",
               &c.zero),
      make_key("bucket_mb",
               "largest gradient all-reduce bucket in MiB (buckets also end at each block's start)",
               &c.bucket_mb),
      make_key("grad_reduce_dtype",
               "what gradients cross the data-parallel group in: fp32, or bf16 (half the bytes; "
               "rounded to bf16, summed in fp32, widened back for the optimizer; ZeRO-1 without "
               "pp also keeps them as bf16, 2 bytes each)",
               &c.grad_reduce_dtype),
      make_key("comm_timeout", "seconds a rank waits in one communication before aborting the job",
               &c.comm_timeout),
  };
}

void apply_setting(std::vector<ConfigKey>& keys, const std::string& key, const std::string& value) {
  for (auto& k : keys)
    if (k.name == key) return k.set(value);
  TRELLIS_REQUIRE(false, "unknown config key '{}' (see trellis train --help)", key);
}

void apply_toml_file(std::vector<ConfigKey>& keys, const std::string& path) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    TRELLIS_REQUIRE(false, "{}:{}:{}: {}", path, src.begin.line, src.begin.column,
                    std::string(e.description()));
  }
  for (auto&& [k, node] : tbl) {
    const std::string key(k.str());
    std::string value;
    if (auto s = node.value<std::string>(); s && node.is_string())
      value = *s;
    else if (node.is_boolean())
      value = *node.value<bool>() ? "true" : "false";
    else if (node.is_integer())
      value = std::to_string(*node.value<int64_t>());
    else if (node.is_floating_point())
      value = fmt::format("{}", *node.value<double>());
    else
      TRELLIS_REQUIRE(false, "{}: key '{}' must be a string, number or boolean", path, key);
    bool known = false;
    for (auto& ck : keys) known |= ck.name == key;
    TRELLIS_REQUIRE(known, "{}: unknown config key '{}' (see trellis train --help)", path, key);
    apply_setting(keys, key, value);
  }
}

std::string dump_config(std::vector<ConfigKey>& keys) {
  std::string out;
  for (auto& k : keys) {
    const std::string v = k.get();
    const bool quoted = k.type == "TEXT";
    out += fmt::format("{} = {}{}{}   # {}\n", k.name, quoted ? "\"" : "", v, quoted ? "\"" : "",
                       k.help);
  }
  return out;
}

}  // namespace trellis
