#pragma once
// Sharded checkpoints: every rank writes what it owns, any layout reads what it needs.
//
//   OUT/step_NNNNNNNN/
//     shard_RRRRR.safetensors  one per world rank: for each state ("params", "exp_avg",
//                              "exp_avg_sq" | "momentum_buffer") one 1-D F32 tensor, the
//                              concatenation of the rank's pieces
//     config.json, state.json  as in whole-file checkpoints (rank 0)
//     index.json               written last: global names, shapes and dtypes, and for every piece
//                              the file, its element offset there, and which elements of the
//                              global tensor it holds
//
// A piece is a flat range [begin, end) of one tensor's slice on one tensor-parallel rank (the
// saving layout's tp, tp_rank). A tensor-parallel slice of a fused tensor (q|k|v, gate|up) is not
// a box of the global tensor, so pieces are not described as boxes: a reader maps each element
// of its own slice to the global tensor (ParamSpec::global_index) and from there to the saving
// rank's slice, in contiguous runs. The whole directory is written under a temporary name, the
// index last, and renamed into place: a checkpoint without its index is never resumed from.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "trellis/model/params.h"

namespace trellis {

// What one rank owns of its local flat buffer (FlatRange: model/params.h) (the ParamLayout of its
// tensor-parallel slice of its pipeline stage): ascending disjoint ranges, and for each state a
// compact array holding the elements of the ranges one after the other. "params" comes first; the
// optimizer's states follow under their names. Replicated data is owned once: DP replicas split the
// buffer among themselves, ZeRO shards own their shard, and tensors replicated across the
// tensor-parallel group are written by its rank 0 only (write_rank_shard skips them elsewhere), as
// are the tied copies of later pipeline stages (their owner's tensor is read in their place).
struct OwnedArrays {
  std::vector<FlatRange> ranges;
  std::vector<std::pair<std::string, const float*>> arrays;
};

// Writes shard_RRRRR.safetensors and its piece list shard_RRRRR.json into dir (not collective).
// Returns the bytes written. A failed write is an input error naming the file.
size_t write_rank_shard(const std::string& dir, int rank, const ParamLayout& layout,
                        const OwnedArrays& owned);
// Once every rank's write_rank_shard returned: merges the piece lists of ranks [0, world) into
// index.json (extra: fields added at the top, e.g. step and layout), after checking that the
// pieces cover every tensor exactly once, and removes the piece lists. Rank 0 only.
void write_checkpoint_index(const std::string& dir, int world, const nlohmann::json& extra);

// Whether dir holds a sharded checkpoint (an index.json).
bool is_sharded_checkpoint(const std::string& dir);
// Empty if dir is a complete checkpoint (sharded: index.json present, parseable, and every file
// it names there with its recorded size; whole-file: state.json and model.safetensors); else one
// line saying what is missing, naming the file.
std::string checkpoint_incomplete(const std::string& dir);

// Reads any layout's slices out of a checkpoint: a sharded one through its index (files memory-
// mapped on first use, only the pages of the needed pieces touched), or a whole-file one
// (model.safetensors + optimizer.safetensors: read whole, as those files always were).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  // The states it holds: "params" first, then the optimizer's.
  const std::vector<std::string>& states() const { return states_; }
  bool has_state(const std::string& state) const;
  bool has_tensor(const std::string& name) const { return tensors_.count(name) > 0; }
  std::vector<std::string> tensor_names() const;
  // Elements per state the checkpoint holds (every tensor's saved global shape).
  int64_t saved_elements() const;
  // Fills `compact` (sum of the ranges' sizes floats) with `state` for the ranges of `layout`'s
  // flat buffer. Elements the checkpoint does not hold (alignment gaps, vocabulary padding beyond
  // the saved padding) become 0; a tensor of layout missing from the checkpoint, or with another
  // shape, is an input error naming the checkpoint.
  void read(const ParamLayout& layout, const std::vector<FlatRange>& ranges,
            const std::string& state, float* compact);
  // Bytes of the files this reader mapped or read so far (tests: a rank reads its slices only).
  size_t bytes_touched() const;
  // How a tensor is stored: its saved global shape, the saving layout's tp and its pieces (the
  // saving rank, tp rank and range of each, sorted). Checkpoints saved in one layout store every
  // tensor alike.
  struct Storage {
    std::vector<int64_t> shape;
    int tp = 1;
    std::vector<std::string> pieces;
    bool operator==(const Storage&) const = default;
  };
  // A tensor the checkpoint holds (has_tensor).
  Storage storage(const std::string& name) const;

 private:
  struct Piece {
    int tp_rank = 0;
    int64_t begin = 0, end = 0;  // flat range of the saving rank's slice
    int file = 0;                // index into files_
    int64_t at = 0;              // element offset into the file's state arrays
  };
  struct Tensor {
    std::vector<int64_t> shape;  // saved global shape (vocabulary rows padded for the saving tp)
    int split_dim = -1, parts = 1, tp = 1;  // tp: the saving layout's (1 when replicated)
    std::vector<Piece> pieces;              // sorted by (tp_rank, begin), tiling each slice
  };
  struct File;
  void open_sharded();
  // open_sharded's steps: the index's files (name -> index into files_), one tensor's entry.
  std::map<std::string, int> open_index_files(const nlohmann::json& index, const std::string& path);
  Tensor index_tensor(const nlohmann::json& t, const std::map<std::string, int>& file_index,
                      const std::string& where) const;
  static void require_pieces_tile(Tensor& tensor, const std::string& where);
  void open_whole();
  const float* state_data(int file, const std::string& state);
  void read_tensor(const ParamSpec& spec, int tp_rank, int64_t lo, int64_t hi,
                   const std::string& state, float* out);

  std::string dir_;
  bool sharded_ = false;
  std::vector<std::string> states_;
  std::map<std::string, Tensor> tensors_;
  std::vector<std::unique_ptr<File>> files_;
};

// `trellis export`: a checkpoint (sharded or whole-file) as a Hugging Face directory: config.json
// and model.safetensors (the family's names and layouts, true vocabulary rows), or, when that
// would exceed max_shard_bytes, model-0000K-of-0000N.safetensors files listed by
// model.safetensors.index.json; and the checkpoint's tokenizer.model (SentencePiece) when it
// has one. Memory: the tensors of one output file at a time.
// Returns the files written.
std::vector<std::string> export_checkpoint(const std::string& dir, const std::string& out,
                                           size_t max_shard_bytes);

}  // namespace trellis
