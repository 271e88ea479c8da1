#pragma once
// `trellis prepare`: text files -> a data directory with train_000000.bin, val_000000.bin and
// meta.json {"tokenizer": kind, "tokenizer_dir": dir, "vocab_size": n, "train_tokens": n,
// "val_tokens": n}.
#include <string>
#include <vector>

namespace trellis {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files (or directories: every regular file inside)
  std::string out_dir;
  std::string tokenizer = "byte";     // "byte" or "gpt2"
  std::string tokenizer_dir;          // for gpt2: directory with encoder.json and vocab.bpe
  double val_fraction = 0.1;          // the last fraction of the token stream becomes val
  size_t shard_tokens = 100'000'000;  // max tokens per shard file
};

struct PrepareResult {
  size_t train_tokens = 0, val_tokens = 0;
};

PrepareResult prepare_dataset(const PrepareOptions& opt);

}  // namespace trellis
