#include "trellis/model/config.h"

#include "trellis/core/error.h"

namespace trellis {

void ModelConfig::validate() const {
  TRELLIS_REQUIRE(n_layer >= 1, "model: n_layer must be >= 1 (got {})", n_layer);
  TRELLIS_REQUIRE(n_head >= 1 && n_embd >= 1, "model: n_head and n_embd must be >= 1");
  TRELLIS_REQUIRE(n_embd % n_head == 0, "model: n_head={} does not divide n_embd={}", n_head,
                  n_embd);
  TRELLIS_REQUIRE(block_size >= 1, "model: block_size must be >= 1 (got {})", block_size);
  TRELLIS_REQUIRE(vocab_size >= 2, "model: vocab_size must be >= 2 (got {})", vocab_size);
  TRELLIS_REQUIRE(vocab_multiple >= 1, "model: vocab_multiple must be >= 1");
}

ModelConfig model_preset(const std::string& name, ModelConfig c) {
  auto set = [&](int l, int h, int e, int t) {
    c.n_layer = l;
    c.n_head = h;
    c.n_embd = e;
    c.block_size = t;
  };
  if (name == "tiny")
    set(2, 2, 32, 64);
  else if (name == "baby")
    set(6, 6, 384, 256);
  else if (name == "gpt2")
    set(12, 12, 768, 1024);
  else if (name == "gpt2-medium")
    set(24, 16, 1024, 1024);
  else if (name == "gpt2-large")
    set(36, 20, 1280, 1024);
  else if (name == "gpt2-xl")
    set(48, 25, 1600, 1024);
  else
    TRELLIS_REQUIRE(
        false,
        "unknown model preset '{}' (choose tiny, baby, gpt2, gpt2-medium, gpt2-large, gpt2-xl)",
        name);
  return c;
}

std::vector<std::string> model_preset_names() {
  return {"tiny", "baby", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

}  // namespace trellis
