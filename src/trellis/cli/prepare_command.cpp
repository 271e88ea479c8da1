// `trellis prepare`: text files -> token shards (llm.c format) with a train/val split (--task lm),
// or labelled texts / idx images / translation pairs -> a task data directory (--task classify,
// --task translate).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "trellis/cli/commands.h"
#include "trellis/core/error.h"
#include "trellis/data/prepare.h"
#include "trellis/data/prepare_task.h"
#include "trellis/data/sentencepiece.h"

namespace trellis {

namespace {

// Flags that only mean something for some tasks; any other task refuses them rather than
// silently ignoring them.
void check_task_flags(const CLI::App& sub, const std::string& task) {
  const struct {
    const char* flag;
    std::vector<std::string> tasks;
  } scoped[] = {{"--shard-tokens", {"lm"}},
                {"--threads", {"lm"}},
                {"--chunk-bytes", {"lm"}},
                {"--progress", {"lm"}},
                {"--val-input", {"classify", "translate"}},
                {"--seed", {"classify", "translate"}},
                {"--text-column", {"classify"}},
                {"--label-column", {"classify"}},
                {"--patch", {"classify"}},
                {"--class-names", {"classify"}},
                {"--max-len", {"translate"}},
                {"--skip-long", {"translate"}}};
  for (const auto& s : scoped)
    TRELLIS_REQUIRE(
        sub.count(s.flag) == 0 || std::find(s.tasks.begin(), s.tasks.end(), task) != s.tasks.end(),
        "prepare: {} does not apply to --task {}", s.flag, task);
}

// The tokenizer flags must agree: SentencePiece's training flags need --tokenizer sentencepiece
// and no --tokenizer-model (which implies sentencepiece when --tokenizer is not given).
void check_tokenizer_flags(const CLI::App& sub, PrepareOptions& o) {
  if (sub.count("--tokenizer-model") && !sub.count("--tokenizer")) o.tokenizer = "sentencepiece";
  const bool sp = o.tokenizer == "sentencepiece";
  TRELLIS_REQUIRE(sp || o.tokenizer_model.empty(),
                  "prepare: --tokenizer-model {} is a SentencePiece model; it needs --tokenizer "
                  "sentencepiece, not {}",
                  o.tokenizer_model, o.tokenizer);
  TRELLIS_REQUIRE(!sp || o.tokenizer_dir.empty(),
                  "prepare: --tokenizer-dir is GPT-2's; give a SentencePiece model with "
                  "--tokenizer-model FILE");
  for (const char* flag :
       {"--vocab-size", "--sp-type", "--sp-sentences", "--sp-character-coverage"}) {
    TRELLIS_REQUIRE(sub.count(flag) == 0 || sp,
                    "prepare: {} applies to --tokenizer sentencepiece (not {})", flag, o.tokenizer);
    TRELLIS_REQUIRE(sub.count(flag) == 0 || o.tokenizer_model.empty(),
                    "prepare: {} is for training a SentencePiece model; --tokenizer-model {} is "
                    "one already",
                    flag, o.tokenizer_model);
  }
  if (sp && o.tokenizer_model.empty()) check_sentencepiece_options(o.sp);
}

}  // namespace

Command add_prepare_command(CLI::App& app) {
  auto task = std::make_shared<std::string>("lm");
  auto o = std::make_shared<PrepareOptions>();
  auto t = std::make_shared<TaskPrepareOptions>();
  CLI::App* sub = app.add_subcommand(
      "prepare", "tokenize text into train/val token shards, or build a task data directory");
  sub->add_option("--task", *task,
                  "lm: text -> token shards; classify: labelled texts (.tsv/.csv/.jsonl) or an "
                  "idx image directory; translate: pairs (.tsv/.po/.mo)")
      ->check(CLI::IsMember({"lm", "classify", "translate"}))
      ->capture_default_str();
  sub->add_option("--input", o->inputs, "input files or directories (repeatable)")->required();
  sub->add_option("--val-input", t->val_inputs,
                  "validation files (repeatable); without them a seeded --val-fraction of the "
                  "input is held out (classify: per class)");
  sub->add_option("--out", o->out_dir, "output data directory")->required();
  sub->add_option("--tokenizer", o->tokenizer, "byte, gpt2 or sentencepiece")
      ->capture_default_str();
  sub->add_option("--tokenizer-dir", o->tokenizer_dir,
                  "directory with GPT-2's encoder.json and vocab.bpe (for --tokenizer gpt2)");
  sub->add_option("--tokenizer-model", o->tokenizer_model,
                  "an existing SentencePiece model (e.g. a LLaMA-2 or T5 tokenizer.model) to use "
                  "instead of training one; implies --tokenizer sentencepiece");
  sub->add_option("--vocab-size", o->sp.vocab_size,
                  "sentencepiece: pieces of the model trained on the input (<unk>, <s>, </s> and "
                  "the 256 byte pieces included)")
      ->capture_default_str();
  sub->add_option("--sp-type", o->sp.type, "sentencepiece: unigram or bpe")->capture_default_str();
  sub->add_option("--sp-sentences", o->sp.sentences,
                  "sentencepiece: most lines the trainer keeps; beyond, a seeded sample of them "
                  "(bounds its memory)")
      ->capture_default_str();
  sub->add_option("--sp-character-coverage", o->sp.character_coverage,
                  "sentencepiece: share of characters that get pieces of their own (the rarest "
                  "others are spelt in bytes); 0.9995 suits large alphabets")
      ->capture_default_str();
  sub->add_option("--val-fraction", o->val_fraction,
                  "share kept for validation (lm: of tokens; tasks: of examples)")
      ->capture_default_str();
  sub->add_option("--shard-tokens", o->shard_tokens, "lm: maximum tokens per shard file")
      ->capture_default_str();
  sub->add_option("--threads", o->threads,
                  "lm: tokenizer threads (GPT-2 BPE; the output does not depend on them)")
      ->capture_default_str();
  sub->add_option("--chunk-bytes", o->chunk_bytes,
                  "lm: bytes of text read and tokenised at a time per thread (memory bound)")
      ->capture_default_str();
  sub->add_option("--progress", o->progress,
                  "lm: progress on stderr: 1 = a redrawn line, 0 = none, -1 = a redrawn line on a "
                  "terminal, else a line every 30 s")
      ->capture_default_str();
  sub->add_option("--seed", t->seed, "classify/translate: seed of the held-out split")
      ->capture_default_str();
  sub->add_option("--text-column", t->text_column,
                  "classify: text column (default: first of sentence, text, review; JSONL: text)");
  sub->add_option("--label-column", t->label_column,
                  "classify: label column (default: first of label, sentiment; JSONL: label)");
  sub->add_option("--patch", t->patch,
                  "classify idx images: patch size P (PxP) or HxW, dividing the image "
                  "(default 7; 1x28 = rows)");
  sub->add_option("--class-names", t->class_names,
                  "classify idx images: comma-separated class names in label order "
                  "(default 0,1,...)");
  sub->add_option("--max-len", t->max_len,
                  "translate: most tokens per side, the end token included; a longer pair is "
                  "refused (an error naming it), not truncated, unless --skip-long")
      ->capture_default_str();
  sub->add_flag("--skip-long", t->skip_long,
                "translate: skip pairs longer than --max-len and count them instead of refusing");
  return {sub, [sub, task, o, t](Communicator&) {
            check_task_flags(*sub, *task);
            check_tokenizer_flags(*sub, *o);
            if (*task == "lm") {
              const PrepareResult r = prepare_dataset(*o);
              fmt::print(
                  "trellis: wrote {} ({} train tokens, {} val tokens, {} documents, tokenizer "
                  "{}, vocab {})\n",
                  o->out_dir, r.train_tokens, r.val_tokens, r.documents, o->tokenizer,
                  r.vocab_size);
              return 0;
            }
            t->task = *task;
            t->inputs = o->inputs;
            t->out_dir = o->out_dir;
            t->tokenizer = o->tokenizer;
            t->tokenizer_dir = o->tokenizer_dir;
            t->tokenizer_model = o->tokenizer_model;
            t->sp = o->sp;
            t->val_fraction = o->val_fraction;
            const TaskPrepareResult r = prepare_task_dataset(*t);
            fmt::print("{}", task_summary(o->out_dir, r));
            return 0;
          }};
}

}  // namespace trellis
