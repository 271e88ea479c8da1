#pragma once
// A checkpoint's whole model on this one rank (tensor-parallel group of one), for the commands
// that evaluate, sample or decode outside training.
#include <memory>
#include <string>

#include "trellis/io/checkpoint.h"
#include "trellis/model/model_chunk.h"

namespace trellis {

struct LocalModel {
  // grads: a gradient buffer in the checkpoint's layout, or null for inference. compute: the GEMM
  // precision (see ModelChunk). tokenizer_dir: where a model with subword n-grams finds its
  // tokenizer (default: the directory the checkpoint records).
  explicit LocalModel(CheckpointData& ck, float* grads = nullptr, DType compute = DType::F32,
                      const std::string& tokenizer_dir = "");
  LocalModel(const LocalModel&) = delete;
  LocalModel& operator=(const LocalModel&) = delete;

  const ParamLayout layout;
  TensorParallel single{nullptr, false};
  ModelChunk model;
  const std::unique_ptr<SubwordNgrams> subword;
};

}  // namespace trellis
