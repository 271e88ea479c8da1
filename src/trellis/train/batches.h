#pragma once
// What a run trains on, addressed by global batch (DESIGN invariant 2) and loaded into micro-batch
// Contexts: the language model's token windows, or a task's examples padded to T. Each also says
// how many targets a global batch holds, the count its loss is normalised by (invariant 3).
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "trellis/data/augment.h"
#include "trellis/data/corpus.h"
#include "trellis/data/examples.h"
#include "trellis/data/mixture.h"
#include "trellis/model/model_chunk.h"

namespace trellis {

class Batches {
 public:
  virtual ~Batches() = default;
  // Sequences [first, first + rows) of global step `step` (0-based) into ctx.
  virtual void fill(int64_t step, int64_t first, int64_t rows, Context& ctx) = 0;
  // Targets of global step `step`: tokens, real target tokens, or examples.
  virtual int64_t step_targets(int64_t step) = 0;
  // Items of the validation split (windows or examples).
  virtual int64_t val_items() const = 0;
  // Validation items [first, first + rows) into the first rows of ctx; the rest of ctx is padding
  // that counts nothing.
  virtual void fill_val(int64_t first, int64_t rows, Context& ctx) = 0;
  // Targets of validation items [0, n).
  virtual int64_t val_targets(int64_t n) = 0;
  // Validation sets (a mixture's datasets, each reported on its own; one otherwise), and which
  // of them val_items / fill_val / val_targets read.
  virtual int val_sets() const { return 1; }
  virtual std::string val_set_name(int) const { return ""; }
  virtual void select_val(int) {}
};

// Language-model windows of a mixture (one directory, or the built-in corpus, is a mixture of
// one): sequence j of step s is the window MixtureOrder and the dataset's GlobalOrder give
// position s*G + j. document_mask: each row also gets its documents' starts (ctx.doc_start,
// from the datasets' document indexes; loader's window_doc_starts).
std::unique_ptr<Batches> make_lm_batches(const Mixture& data, int64_t T, int64_t global_batch,
                                         uint64_t seed, bool shuffle, bool document_mask = false);

// A prepared task directory (`trellis prepare --task`).
struct TaskData {
  std::string dir;
  TaskMeta meta;
  ExampleSet train, val;
};
TaskData load_task_data(const std::string& dir);

// How a task lays one example out in a row of a Context padded to T positions.
//   classify:  [S] text [S] (text truncated to T - 2), or the patches of an image; label. With
//              patch_context c, patch (y, x)'s input is patches (y + dy, x + dx) for dy, then
//              dx, in [-c, c], zeros off the image: an overlapping patch embedding, the same as
//              a convolution of kernel (2c + 1)P, stride P and zero padding cP.
//   translate: source [S] for the encoder (ctx.src_tokens, ctx.lengths); [S] target as the
//              decoder's input (ctx.tokens) and target [S] as its targets, padding -1.
// S is the special token. Padding repeats S (masked out; its targets are -1).
struct SequenceFormat {
  std::string task;  // "classify" or "translate"
  int special = 0;
  int feature_dim = 0;  // > 0: features (pixel bytes / 255) instead of tokens
  int64_t T = 0;
  // Images: each patch's input also holds the patches up to this many rows and columns away (the
  // config key patch_context), with the grid of patches they are taken from.
  int patch_context = 0, grid_rows = 0, grid_cols = 0;
  SequenceFormat() = default;
  SequenceFormat(const TaskMeta& meta, int64_t T, int patch_context = 0);
  // Values a position's input holds: feature_dim for each patch of its neighbourhood.
  int input_features() const;
  // Positions an example needs (before truncation).
  int64_t needed(std::span<const uint32_t> source, std::span<const uint32_t> target) const;
  // Real targets the example adds to the loss's count (1 for a classifier).
  int64_t targets(std::span<const uint32_t> target) const;
  // Writes the example into row r of ctx (sized by ModelChunk::prepare, lengths/labels for B).
  void put(Context& ctx, int64_t r, std::span<const uint32_t> source,
           std::span<const uint32_t> target, int32_t label) const;
  // Row r counts nothing (a short last micro-batch).
  void put_padding(Context& ctx, int64_t r) const;
};

// The positions a task's examples need: the longest, with the special tokens.
int64_t task_seq_len(const TaskData& d);
// augment: training images only, each example as augment_draw(seed, epoch, its index in the
// training set) gives (data/augment.h); epoch = its position in the endless sequence of epochs
// (step * global_batch + j) / examples, as the order's.
std::unique_ptr<Batches> make_task_batches(const TaskData& d, int64_t T, int64_t global_batch,
                                           uint64_t seed, bool shuffle,
                                           const Augment& augment = {}, int patch_context = 0);

}  // namespace trellis
