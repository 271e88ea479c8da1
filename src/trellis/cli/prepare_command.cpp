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
  sub->add_option("--tokenizer", o->tokenizer, "byte or gpt2")->capture_default_str();
  sub->add_option("--tokenizer-dir", o->tokenizer_dir,
                  "directory with GPT-2's encoder.json and vocab.bpe (for --tokenizer gpt2)");
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
            if (*task == "lm") {
              const PrepareResult r = prepare_dataset(*o);
              fmt::print(
                  "trellis: wrote {} ({} train tokens, {} val tokens, {} documents, tokenizer "
                  "{})\n",
                  o->out_dir, r.train_tokens, r.val_tokens, r.documents, o->tokenizer);
              return 0;
            }
            t->task = *task;
            t->inputs = o->inputs;
            t->out_dir = o->out_dir;
            t->tokenizer = o->tokenizer;
            t->tokenizer_dir = o->tokenizer_dir;
            t->val_fraction = o->val_fraction;
            const TaskPrepareResult r = prepare_task_dataset(*t);
            fmt::print("{}", task_summary(o->out_dir, r));
            return 0;
          }};
}

}  // namespace trellis
