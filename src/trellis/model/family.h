#pragma once
// A family is an architecture: the block choices it fixes, the Hugging Face names of its
// parameters and its config.json. Each lives in one file under model/families/; the model, the
// parallel layer and the trainer only see slots and specs.
#include <string>

#include "nlohmann/json.hpp"
#include "trellis/model/config.h"
#include "trellis/model/params.h"

namespace trellis {

// Reads typed keys of a config.json, failing with one line naming the file and the key.
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {}
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // An integer in [lo, hi]; anything else (a float, a string, 1e9 layers) names the key.
  int get_int(const char* key, int lo, int hi) const;
  double get_number(const char* key) const;
  bool get_bool(const char* key) const;
  // Refuses a present key whose value is not one trellis implements (e.g. another activation).
  void expect(const char* key, const nlohmann::json& value, const char* why) const;

 private:
  const nlohmann::json& j_;
  std::string path_;
};

// The sizes under Hugging Face's common key names (hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads, num_hidden_layers, max_position_embeddings,
// vocab_size), each bounded, as LLaMA-style configs and trellis's encoder write them.
void read_common_sizes(const HfConfigReader& r, ModelConfig& m);

// A float as the decimal a person wrote (1e-5, not 9.99999974e-06) for config.json.
double json_number(float v);

struct Family {
  const char* arch;
  // The architecture's fixed choices (norm, positions, MLP, biases, tied head, mask).
  void (*configure)(ModelConfig& cfg);
  // Token (and position) embeddings; a later stage that uses the token embedding (a tied head, a
  // decoder's start) declares it again as its copy.
  void (*embedding)(ParamBuilder& b);
  void (*block)(ParamBuilder& b, int layer);
  // Final norm and, when untied, the output projection.
  void (*head)(ParamBuilder& b);
  nlohmann::json (*to_hf_config)(const ModelConfig& cfg);
  // Sizes from a config.json (after configure).
  void (*from_hf_config)(const HfConfigReader& r, ModelConfig& cfg);
  // Whether a config.json (its "model_type") is this family's.
  const char* model_type;
  // Blocks [n_layer, n_layer + n_dec_layer) are decoder blocks over an encoder's output.
  bool encoder_decoder = false;
};

const Family& family_of(const std::string& arch);
// The family of a config.json by its model_type; a config without one is GPT-2.
const Family& family_of_hf_config(const nlohmann::json& j, const std::string& path);

}  // namespace trellis
