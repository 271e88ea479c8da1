#include "trellis/parallel/replicated_grads.h"

#include <algorithm>
#include <span>

namespace trellis {

void reduce_replicated_grads(TensorParallel& tp, const ParamLayout& layout,
                             const std::vector<FlatRange>& owned, float* grads) {
  if (!tp.sequence_parallel()) return;
  // Each replicated tensor's part inside each owned range, in a fixed order on every rank.
  std::vector<std::span<float>> pieces;
  size_t at = 0;
  for (const FlatRange& r : owned) {
    for (const auto& s : layout.specs()) {
      if (s.split_dim >= 0) continue;
      const size_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.numel());
      if (lo < hi) pieces.emplace_back(grads + at + (lo - r.begin), hi - lo);
    }
    at += r.size();
  }
  tp.all_reduce_pieces(pieces);
}

}  // namespace trellis
