// `trellis prepare`: text files -> token shards (llm.c format) with a train/val split.
#include <fmt/format.h>

#include "trellis/cli/commands.h"
#include "trellis/data/prepare.h"

namespace trellis {

Command add_prepare_command(CLI::App& app) {
  auto o = std::make_shared<PrepareOptions>();
  CLI::App* sub = app.add_subcommand("prepare", "tokenize text into train/val token shards");
  sub->add_option("--input", o->inputs, "text files or directories (repeatable)")->required();
  sub->add_option("--out", o->out_dir, "output data directory")->required();
  sub->add_option("--tokenizer", o->tokenizer, "byte or gpt2")->capture_default_str();
  sub->add_option("--tokenizer-dir", o->tokenizer_dir,
                  "directory with GPT-2's encoder.json and vocab.bpe (for --tokenizer gpt2)");
  sub->add_option("--val-fraction", o->val_fraction, "share of tokens kept for validation")
      ->capture_default_str();
  sub->add_option("--shard-tokens", o->shard_tokens, "maximum tokens per shard file")
      ->capture_default_str();
  return {sub, [o](Communicator&) {
            const PrepareResult r = prepare_dataset(*o);
            fmt::print("trellis: wrote {} ({} train tokens, {} val tokens, tokenizer {})\n",
                       o->out_dir, r.train_tokens, r.val_tokens, o->tokenizer);
            return 0;
          }};
}

}  // namespace trellis
