#pragma once
// The whole model as one process would hold it (tp = 1, every stage): gathered from the tensor-
// parallel slices and pipeline stages of all ranks, for checkpoints.
#include <vector>

#include "trellis/model/params.h"
#include "trellis/parallel/mesh.h"

namespace trellis {

// Collective over the tp and pp groups; every rank gets the result.
std::vector<float> gather_global(Mesh& mesh, const ParamLayout& local, const float* data);

}  // namespace trellis
