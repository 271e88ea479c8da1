#pragma once
// The key/value cache of incremental decoding (one rank, inference): per sequence ("row") the
// self-attention keys and values of every position decoded so far, and for an encoder-decoder a
// shared pointer to its source's cross-attention keys and values, computed once per source.
// ModelChunk::decode appends positions and returns the logits of each row's newest one.
#include <cstdint>
#include <memory>
#include <vector>

namespace trellis {

struct KVCache {
  // An encoder-decoder's source as every decoder block's cross-attention sees it: for each of its
  // `length` positions, each decoder block's keys then values ([Hkv * hd] each).
  struct Source {
    int32_t length = 0;
    std::vector<float> kv;  // [length][decoder blocks][2][Hkv * hd]
  };
  struct Row {
    int32_t length = 0;     // positions cached
    std::vector<float> kv;  // [length][decoder blocks][2][Hkv * hd], capacity reserved
    std::shared_ptr<const Source> source;  // encoder-decoder only
  };
  int64_t capacity = 0;  // positions a row may hold (at most the model's context)
  int64_t stride = 0;    // floats per position: decoder blocks * 2 * Hkv * hd
  std::vector<Row> rows;

  int64_t size() const { return int64_t(rows.size()); }
  // Row i becomes the old row from[i]; rows not named leave (finished hypotheses or sentences),
  // a row named twice is copied (beam search: two children of one hypothesis). The sources are
  // shared, never copied.
  void select(const std::vector<int64_t>& from);
  // Every row empty again (its reserved memory kept).
  void clear();

  // Scratch of ModelChunk::decode, reused between steps.
  struct Work {
    std::vector<float> x, y, ln, mean, rstd, qkv, att, mid, cross, xq, up, act, last, logits;
    std::vector<int32_t> tokens, positions, past, src_len;
    std::vector<int64_t> qrow;
    std::vector<const float*> k, v;
  } work;
};

}  // namespace trellis
