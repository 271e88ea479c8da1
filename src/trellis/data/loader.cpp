#include "trellis/data/loader.h"

#include <algorithm>
#include <bit>
#include <numeric>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/core/philox.h"

namespace trellis {

int64_t window_count(const TokenStream& tokens, int64_t T) {
  const int64_t n = tokens.size() > 0 ? (tokens.size() - 1) / T : 0;
  TRELLIS_REQUIRE(n >= 1, "training data has {} tokens: too few for one sequence of {} (+1) tokens",
                  tokens.size(), T);
  return n;
}

GlobalOrder::GlobalOrder(int64_t items, int64_t global_batch, uint64_t seed, bool shuffle,
                         uint64_t stream)
    : n_(items), G_(global_batch), seed_(seed), stream_(stream), shuffle_(shuffle) {
  TRELLIS_CHECK(items >= 1, "an order over no items");
  // The Feistel network permutes 2h-bit numbers; 4^h >= n, so cycle-walking takes < 4 rounds of
  // it on average.
  const int bits = std::max(2, int(std::bit_width(uint64_t(items - 1))));
  half_bits_ = (bits + 1) / 2;
}

// Six Feistel rounds with Philox as the round function: a pseudo-random permutation of
// [0, 4^h) keyed by (seed, stream, epoch).
uint64_t GlobalOrder::permute(uint64_t epoch, uint64_t x) const {
  const int h = half_bits_;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  uint64_t left = x >> h, right = x & mask;
  for (uint64_t round = 0; round < 6; ++round) {
    const double u = philox_uniform(seed_, stream_ + epoch, (round << 40) | right);
    const uint64_t f = uint64_t(u * 9007199254740992.0) & mask;  // 53 random bits, cut to h
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << h) | right;
}

const std::vector<int64_t>& GlobalOrder::stored(int64_t epoch) const {
  if (epoch == cached_epoch_) return order_;
  order_.resize(size_t(n_));
  std::iota(order_.begin(), order_.end(), int64_t(0));
  // Fisher-Yates driven by a counter-based stream keyed by (seed, epoch).
  const uint64_t stream = stream_ + uint64_t(epoch);
  for (int64_t i = n_ - 1; i > 0; --i) {
    const int64_t k = int64_t(philox_uniform(seed_, stream, uint64_t(i)) * double(i + 1));
    std::swap(order_[size_t(i)], order_[size_t(std::min(k, i))]);
  }
  cached_epoch_ = epoch;
  return order_;
}

int64_t GlobalOrder::at(int64_t pos) const {
  const int64_t epoch = pos / n_, i = pos % n_;
  if (!shuffle_ || n_ == 1) return i;
  if (n_ <= kStoredOrderMax) return stored(epoch)[size_t(i)];
  // Cycle-walking: apply the permutation of the larger domain until the value lands in [0, n).
  // The values form cycles of that permutation, so this is a permutation of [0, n).
  uint64_t x = uint64_t(i);
  do {
    x = permute(uint64_t(epoch), x);
  } while (x >= uint64_t(n_));
  return int64_t(x);
}

BatchLoader::BatchLoader(const TokenStream& tokens, int64_t seq_len, int64_t global_batch,
                         uint64_t seed, bool shuffle)
    : tokens_(tokens),
      T_(seq_len),
      order_(window_count(tokens, seq_len), global_batch, seed, shuffle) {}

void fill_window(const TokenStream& tokens, int64_t T, int64_t w, int32_t* inputs,
                 int32_t* targets) {
  // T+1 tokens: the inputs and, shifted by one, the targets.
  thread_local std::vector<int32_t> buf;
  buf.resize(size_t(T + 1));
  tokens.read(w * T, T + 1, buf.data());
  std::copy_n(buf.data(), T, inputs);
  std::copy_n(buf.data() + 1, T, targets);
}

void window_doc_starts(const TokenStream& tokens, int64_t T, int64_t w, int32_t* doc_start) {
  thread_local std::vector<int64_t> starts;
  starts.clear();
  tokens.doc_starts(w * T + 1, T - 1, starts);
  int32_t cur = 0;
  size_t k = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (k < starts.size() && starts[k] == w * T + t) cur = int32_t(t), ++k;
    doc_start[t] = cur;
  }
}

void BatchLoader::fill(int64_t step, int64_t first, int64_t rows, int32_t* inputs,
                       int32_t* targets) const {
  for (int64_t r = 0; r < rows; ++r)
    fill_window(tokens_, T_, window(step, first + r), inputs + r * T_, targets + r * T_);
}

void fill_eval_windows(const TokenStream& tokens, int64_t T, int64_t first, int64_t rows,
                       int32_t* inputs, int32_t* targets) {
  const int64_t need = (first + rows) * T + 1;
  TRELLIS_REQUIRE(tokens.size() >= need,
                  "evaluation needs {} tokens ({} windows of {}) but the data holds {}", need,
                  first + rows, T, tokens.size());
  for (int64_t r = 0; r < rows; ++r)
    fill_window(tokens, T, first + r, inputs + r * T, targets + r * T);
}

}  // namespace trellis
