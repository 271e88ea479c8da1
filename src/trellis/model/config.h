#pragma once
// GPT-2 architecture hyper-parameters and the presets.
#include <cstdint>
#include <string>
#include <vector>

namespace trellis {

struct ModelConfig {
  int n_layer = 2;
  int n_head = 2;
  int n_embd = 64;
  int block_size = 64;      // context length (n_positions)
  int vocab_size = 256;     // true vocabulary; comes from the tokenizer/data
  int vocab_multiple = 64;  // rows of wte padded up to a multiple of this (speed only)

  int padded_vocab() const {
    return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  }
  int head_size() const { return n_embd / n_head; }
  // Throws an input error for impossible shapes.
  void validate() const;
};

// Presets: tiny, baby, gpt2, gpt2-medium, gpt2-large, gpt2-xl. vocab_size is left as is.
ModelConfig model_preset(const std::string& name, ModelConfig base = {});
std::vector<std::string> model_preset_names();

}  // namespace trellis
