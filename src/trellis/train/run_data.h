#pragma once
// What a training run trains on, loaded once: `train` (also under --layout auto, whose planner
// needs the model and sequence length it implies) and `train --dry-run` share it.
#include <cstdint>
#include <memory>

#include "trellis/data/augment.h"
#include "trellis/data/mixture.h"
#include "trellis/io/checkpoint.h"
#include "trellis/model/config.h"
#include "trellis/train/batches.h"
#include "trellis/train/config.h"

namespace trellis {

// What a run trains on (a corpus or mixture, or a task's examples) and the model and sequence
// length that implies.
struct RunData {
  Mixture lm;
  std::unique_ptr<TaskData> task;
  TokenizerInfo tokenizer;
  ModelConfig model;
  int64_t T = 0;
  Augment augment;
};

// Input errors: data that does not exist or does not fit the task, the model or seq_len.
RunData load_run_data(const TrainConfig& cfg);

// epochs and val_per_epoch turned into steps and val_every for the training set d holds (no-op
// when both are 0). Input error: negative, or set for a language model's corpus.
void resolve_epochs(TrainConfig& cfg, const RunData& d);

}  // namespace trellis
