#pragma once
// A checkpoint's whole model on this one rank (tensor-parallel group of one), for the commands
// that evaluate, sample or decode outside training.
#include "trellis/io/checkpoint.h"
#include "trellis/model/model_chunk.h"

namespace trellis {

struct LocalModel {
  // grads: a gradient buffer in the checkpoint's layout, or null for inference. compute: the GEMM
  // precision (see ModelChunk).
  explicit LocalModel(CheckpointData& ck, float* grads = nullptr, DType compute = DType::F32)
      : layout(ck.model), model(layout, ck.params.data(), grads, single, nullptr, compute) {}
  LocalModel(const LocalModel&) = delete;
  LocalModel& operator=(const LocalModel&) = delete;

  const ParamLayout layout;
  TensorParallel single{nullptr, false};
  ModelChunk model;
};

}  // namespace trellis
