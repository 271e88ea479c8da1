#pragma once
// The sequence-parallel sum of replicated parameters' gradients. Under sequence parallelism each
// tensor-parallel rank computes the gradients of the parameters replicated across the group
// (norms, row-parallel biases, positions) from its own rows only.
#include <vector>

#include "trellis/model/params.h"
#include "trellis/tensor_parallel/operators.h"

namespace trellis {

// Sums those gradients over the tensor-parallel group, packed into one all-reduce; without
// sequence parallelism they are complete already and nothing runs. owned: the ranges of the
// layout's gradients this rank holds reduced over data parallelism, given compact in grads (the
// same ranges on every tensor-parallel rank: slices share offsets).
void reduce_replicated_grads(TensorParallel& tp, const ParamLayout& layout,
                             const std::vector<FlatRange>& owned, float* grads);

}  // namespace trellis
