#pragma once
// Fine-tuning from a Hugging Face model directory (`trellis train --init-from DIR`): DIR holds
// config.json and either model.safetensors or a sharded model.safetensors.index.json with its
// shards; tensors may be F32, F16 or BF16.
#include <string>
#include <vector>

#include "trellis/model/config.h"
#include "trellis/model/params.h"

namespace trellis {

// The model DIR's config.json describes (its family's sizes and block choices; vocab_size as
// written there). Errors name the file and key.
ModelConfig pretrained_model_config(const std::string& dir);

struct PretrainedReport {
  std::vector<std::string> loaded;       // tensors taken from DIR
  std::vector<std::string> initialised;  // tensors DIR lacks (task heads), left as they were
};

// Writes DIR's tensors into `params`, a flat buffer laid out by `global` (tp = 1, whole model).
// The names are the family's Hugging Face names; GPT-2's may carry the "transformer." prefix,
// its attn.bias / attn.masked_bias buffers are ignored and a tied lm_head.weight is accepted.
// A task head `global` has and DIR lacks (classifier / score) keeps its value and is reported;
// any other missing tensor, a tensor of another shape, or an unknown tensor is an input error
// naming DIR and the tensor.
PretrainedReport load_pretrained(const std::string& dir, const ParamLayout& global, float* params);

}  // namespace trellis
