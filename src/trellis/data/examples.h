#pragma once
// The examples of the classification and translation tasks, as `trellis prepare --task` writes
// them and the trainer reads them (whole: they are small next to language-model corpora).
//
// A task data directory holds meta.json (TaskMeta), train.examples and val.examples. An examples
// file is little-endian:
//   "TRLSEXMP"  8 bytes magic
//   uint32      version (1)
//   uint32      value_bytes: 1, 2 or 4 (how each stored value is written)
//   uint64      n examples
//   int32       labels[n]         (class id; -1 for translation pairs)
//   uint64      ends[2n]          cumulative ends: example i's source is values[ends[2i-1],
//                                 ends[2i]) (from 0 for i = 0), its target values[ends[2i],
//                                 ends[2i+1]) (empty for classification)
//   values      ends[2n-1] values of value_bytes each
// Values are token ids (without any special token: the trainer adds them), or for image inputs
// the pixel bytes of the example's patches in order (feature_dim bytes per patch).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace trellis {

struct ExampleSet {
  std::vector<int32_t> labels;
  std::vector<uint64_t> ends;
  std::vector<uint32_t> values;

  size_t size() const { return labels.size(); }
  std::span<const uint32_t> source(size_t i) const;
  std::span<const uint32_t> target(size_t i) const;
  void add(int32_t label, std::span<const uint32_t> source, std::span<const uint32_t> target = {});
};

// Writes atomically with the smallest value width that holds every value.
void write_examples(const std::string& path, const ExampleSet& set);
// Reads and validates (magic, version, sizes, monotone ends); any problem is an input error
// naming the file.
ExampleSet read_examples(const std::string& path);

// meta.json of a task data directory.
struct TaskMeta {
  std::string task;       // "classify" or "translate"
  std::string tokenizer;  // "byte" or "gpt2" (token inputs)
  std::string tokenizer_dir;
  int vocab_size = 0;      // the model's vocabulary: the tokenizer's plus the special token if new
  int special_token = -1;  // begins/ends sequences (BOS/EOS/CLS); GPT-2: <|endoftext|>; byte: 256
  std::vector<std::string> classes;  // class names in id order (classify)
  int feature_dim = 0;  // > 0: inputs are patches of feature_dim pixel bytes (images), not tokens
  // Images: their size and the patches they were cut into (patch_height * patch_width =
  // feature_dim), which augmentation needs to rebuild the image; 0 in directories prepared before
  // they were recorded.
  int image_height = 0, image_width = 0, patch_height = 0, patch_width = 0;
  std::string val_split = "val";  // what val.examples holds: "val" (held out) or "test"
  int64_t train_examples = 0, val_examples = 0;
  int64_t max_source_len = 0, max_target_len = 0;  // longest stored sequences (values / patches)
};

// True when dir/meta.json names a task ("task" key).
bool is_task_dir(const std::string& dir);
TaskMeta read_task_meta(const std::string& dir);
void write_task_meta(const std::string& dir, const TaskMeta& meta);

}  // namespace trellis
