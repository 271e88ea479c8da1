#pragma once
// `trellis average`: the element-wise mean of several checkpoints' parameters, as fairseq's
// scripts/average_checkpoints.py computes it for translation models, written as a new checkpoint.
#include <cstdint>
#include <string>
#include <vector>

namespace trellis {

struct AverageResult {
  std::string out;         // the checkpoint written
  int64_t tensors = 0;     // tensors averaged
  int64_t parameters = 0;  // their elements
};

// Averages the parameters of `dirs` (at least two complete checkpoints, sharded or whole-file) into
// the new directory `out`, a single-rank sharded checkpoint that eval, sample, translate,
// classify, export and `train --init-from` read. Each element is the mean of its values summed in
// double, rounded once to float. The checkpoints must hold the same model (every tensor's name and
// shape, and config.json but its tokenizer_dir) stored in the same layout (every tensor's tp and
// pieces); otherwise an input error names the first tensor or config key that differs and the two
// checkpoints. out carries the first checkpoint's config.json and other metadata files (a
// tokenizer model) and no optimizer state; its state.json lists what was averaged, and the
// trainer refuses to resume it. Memory: the output model plus one tensor (in double) at a time.
// out is written under a temporary name and renamed into place; it must not exist.
AverageResult average_checkpoints(const std::vector<std::string>& dirs, const std::string& out);

}  // namespace trellis
