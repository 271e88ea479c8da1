#pragma once
// Checkpoints: OUT/step_NNNNNNNN/ (and OUT/best/ under keep_best, alike) with config.json (the
// family's HF config plus a "trellis" section), state.json (step, data position, RNG, training
// config) and the tensors: sharded (one file per rank plus index.json, io/sharded_checkpoint.h:
// what training writes) or whole-file (model.safetensors with the family's Hugging Face names and
// layouts, optimizer.safetensors with moments per parameter, same names: what trellis wrote before
// sharding, and `trellis export`'s model part). The directory is written under a temporary name
// and renamed into place. A SentencePiece model's checkpoints also hold its tokenizer.model.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "trellis/model/config.h"
#include "trellis/model/params.h"

namespace trellis {

class Tokenizer;

struct TokenizerInfo {
  std::string kind = "byte";
  // gpt2: the directory of encoder.json and vocab.bpe; sentencepiece: of tokenizer.model (a
  // loaded checkpoint's own directory; config.json records none).
  std::string dir;
  std::string model;  // sentencepiece, when saving: tokenizer.model's bytes
  int vocab = 0;      // sentencepiece: its pieces (config.json's trellis.tokenizer_vocab); 0 = none
};

struct OptimizerState {
  // name ("exp_avg", ...) and a full (unsharded) flat buffer in the parameter layout
  std::vector<std::pair<std::string, std::vector<float>>> buffers;
};

struct CheckpointData {
  ModelConfig model;
  TokenizerInfo tokenizer;
  std::vector<float> params;  // flat, ParamLayout(model)
  OptimizerState optimizer;   // may be empty (model-only checkpoints)
  nlohmann::json state;       // step, seed, config, ...
  // What a task model needs to read its inputs and name its outputs (config.json's trellis.task:
  // task, classes, special_token, feature_dim, patch_context, seq_len); null for a language model.
  nlohmann::json task;
};

std::string checkpoint_dir_name(int64_t step);
// Writes OUT/step_NNNNNNNN atomically; returns its path.
std::string save_checkpoint(const std::string& out_dir, int64_t step, const CheckpointData& ck);
// Newest complete OUT/step_* (checkpoint_incomplete is empty); empty if none. Newer incomplete
// ones are passed over, each with one line naming what is missing in `skipped`.
std::string find_latest_checkpoint(const std::string& out_dir,
                                   std::vector<std::string>* skipped = nullptr);
// config.json's text for a checkpoint of this model (its family's Hugging Face keys plus the
// "trellis" section).
std::string checkpoint_config_json(const ModelConfig& model, const TokenizerInfo& tokenizer,
                                   const nlohmann::json& task);
// The model a config.json describes: its family's Hugging Face keys (model_type picks the
// family), plus vocabulary padding and block choices from the "trellis" section of the configs
// trellis writes. Input errors name the file and key.
ModelConfig read_model_config(const std::string& config_path);
// The same from config.json's text; `path` names it in errors.
ModelConfig parse_model_config(const std::string& text, const std::string& path);
// A state.json: a JSON object whose "step" is a non-negative integer. Input errors name the file.
nlohmann::json parse_checkpoint_state(const std::string& text, const std::string& path);
// A checkpoint's JSON file (config.json, state.json, index.json) parsed; a missing file or
// invalid JSON is an input error naming the file.
nlohmann::json read_json_file(const std::string& path);
// Loads and validates (names, shapes, config), whole-file or sharded (then the whole model is
// assembled from the shards). with_optimizer: also the optimizer state and state.json.
CheckpointData load_checkpoint(const std::string& dir, bool with_optimizer);
// What config.json says (model, tokenizer, task), without the tensors.
CheckpointData load_checkpoint_config(const std::string& dir);
// The tokenizer of a loaded checkpoint: its kind, from `dir` when given (else the recorded
// directory; SentencePiece: the checkpoint's own tokenizer.model). A vocabulary that disagrees
// with the model (more ids than its vocab_size, special token included, or other than the
// recorded number of SentencePiece pieces) is an input error naming the tokenizer's file.
std::unique_ptr<Tokenizer> load_checkpoint_tokenizer(const CheckpointData& ck,
                                                     const std::string& dir = "");

}  // namespace trellis
