#pragma once
// `trellis prepare`: text files -> a data directory with train_000000.bin, val_000000.bin, …, a
// document index beside each shard (train_000000.idx, data/doc_index.h), and meta.json
// {"tokenizer": kind, "tokenizer_dir": dir, "vocab_size": n, "train_tokens": n,
// "val_tokens": n, "documents": n}, and with a SentencePiece tokenizer its model as
// tokenizer.model (trained on the input first, or --tokenizer-model's copied).
//
// Documents: each non-empty input file is one document. With GPT-2's tokenizer an <|endoftext|>
// token separates consecutive documents and is the first token of the document it opens (as in
// llm.c's shards: it plays the part of a beginning-of-text token); the byte tokenizer has no such
// token, so its documents abut; SentencePiece's </s> separates them as GPT-2's token does. The
// token stream is the documents in input order; its last
// val_fraction becomes val.
//
// Streaming: inputs are read in chunks of chunk_bytes, cut only where the GPT-2 pre-tokenizer
// would cut anyway (before " X" with X an ASCII letter after a printable ASCII character), so the
// tokens equal those of whole-file encoding (SentencePiece, which encodes line by line: after a
// newline); a chunk is tokenised by one of `threads` tokenizers
// and emitted in order, so the output does not depend on the thread count. Tokens go to shard-
// sized spool files in a temporary directory inside out_dir; when the total is known, full train
// shards are renamed into place and the tail (the last train shard and val) is copied. Memory is
// bounded by threads x (a chunk and its tokens) plus I/O buffers, whatever the input size. A
// failure leaves out_dir as it was.
#include <cstddef>
#include <string>
#include <vector>

#include "trellis/data/sentencepiece.h"

namespace trellis {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files (or directories: every regular file inside)
  std::string out_dir;
  std::string tokenizer = "byte";  // "byte", "gpt2" or "sentencepiece"
  std::string tokenizer_dir;       // for gpt2: directory with encoder.json and vocab.bpe
  std::string tokenizer_model;     // sentencepiece: a model file; empty = train one (sp)
  SentencePieceOptions sp;
  double val_fraction = 0.1;          // the last fraction of the token stream becomes val
  size_t shard_tokens = 100'000'000;  // max tokens per shard file
  int threads = 2;                    // tokenizer threads (GPT-2 BPE; the byte tokenizer uses 1)
  size_t chunk_bytes = size_t(1) << 20;  // text per tokenizer call
  // Progress on stderr: 1 = a line redrawn a few times a second, 0 = none; -1 = auto (a redrawn
  // line when stderr is a terminal, else a line every 30 s).
  int progress = -1;
};

struct PrepareResult {
  size_t train_tokens = 0, val_tokens = 0, documents = 0;
  int vocab_size = 0;
};

PrepareResult prepare_dataset(const PrepareOptions& opt);

}  // namespace trellis
