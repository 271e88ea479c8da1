#pragma once
// Translation with an encoder-decoder on one rank: greedy search (beam 1) and beam search.
// Hypotheses are scored by their summed log-probability divided by the length penalty of Wu et
// al. 2016 (GNMT), lp = ((5 + |Y|) / 6)^alpha, which the Transformer paper used with alpha = 0.6
// and beam 4; |Y| counts the end token. With `cache` the encoder runs once and each step decodes
// one new position per live hypothesis over the key/value cache (ModelChunk::decode), whose
// rows follow the hypotheses as beam search keeps, copies and drops them. Without it every step
// re-runs the model over the padded sequences so far: the reference the cached path must match
// token for token (float sums may differ in their last bits; ties go to the lower token id).
#include <cstdint>
#include <span>
#include <vector>

#include "trellis/model/model_chunk.h"

namespace trellis {

struct DecodeOptions {
  int beam = 1;
  int64_t max_len = 0;  // most generated tokens (the end token included); 0 = the context
  double alpha = 0.6;   // length penalty exponent (beam > 1)
  int special = 0;      // begins the decoder's input and ends a hypothesis
  int64_t T = 0;        // positions of the padded sequences
  bool cache = true;    // key/value-cached decoding (false: re-run the prefix every step)
};

// The target tokens (without the end token) the model produces for each source (without its end
// token; at most T - 1 tokens). The sentences are decoded together, one row per live hypothesis,
// padded to the longest source or prefix of the step.
std::vector<std::vector<int>> translate(ModelChunk& model,
                                        const std::vector<std::span<const uint32_t>>& sources,
                                        const DecodeOptions& opt);

}  // namespace trellis
