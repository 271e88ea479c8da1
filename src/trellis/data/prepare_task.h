#pragma once
// `trellis prepare --task classify|translate`: labelled texts, idx image sets or translation
// pairs -> a task data directory (meta.json, train.examples, val.examples; see examples.h).
// Everything is read, checked and encoded in memory first; the directory is written under a
// temporary name and renamed into place, so bad input leaves nothing behind. A SentencePiece
// tokenizer is trained on the training split's texts (translation: one model shared by both
// sides, as fairseq, Marian and T5 do) and kept in the directory as tokenizer.model.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trellis/data/examples.h"
#include "trellis/data/sentencepiece.h"

namespace trellis {

struct TaskPrepareOptions {
  std::string task;                     // "classify" or "translate"
  std::vector<std::string> inputs;      // files; for images one idx directory
  std::vector<std::string> val_inputs;  // explicit validation files (else a held-out split)
  std::string out_dir;
  std::string tokenizer = "byte";  // "byte", "gpt2" or "sentencepiece"
  std::string tokenizer_dir;
  std::string tokenizer_model;  // sentencepiece: a model file; empty = train one (sp)
  SentencePieceOptions sp;
  std::string text_column, label_column;  // classify text files; empty = the format's defaults
  double val_fraction = 0.1;
  uint64_t seed = 1337;
  std::string patch;        // images: "P" (PxP) or "HxW"; empty = 7x7
  std::string class_names;  // images: comma-separated names in label order
  int max_len = 256;        // translate: tokens per side, the end token included
  bool skip_long = false;   // translate: skip (and count) over-long pairs
};

struct TaskPrepareResult {
  TaskMeta meta;
  std::vector<int64_t> train_per_class, val_per_class;  // classify
  std::map<std::string, int64_t> skipped;               // reason -> count
};

TaskPrepareResult prepare_task_dataset(const TaskPrepareOptions& opt);
// The lines `trellis prepare` prints about a finished task directory.
std::string task_summary(const std::string& out_dir, const TaskPrepareResult& r);

// Class names in id order: numeric order when every label is an integer, else sorted.
std::vector<std::string> order_classes(const std::vector<std::string>& labels);
// The held-out share of each class: per class a seeded shuffle picks round(fraction * count)
// examples (at least 1 and at most count - 1 when the class has 2 or more). Returns 1 for each
// example that goes to validation.
std::vector<char> stratified_val_mask(const std::vector<int32_t>& labels, size_t n_classes,
                                      double fraction, uint64_t seed);

}  // namespace trellis
