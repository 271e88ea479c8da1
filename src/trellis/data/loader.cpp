#include "trellis/data/loader.h"

#include <numeric>

#include "trellis/core/error.h"
#include "trellis/core/philox.h"

namespace trellis {

namespace {
int64_t window_count(const std::vector<uint16_t>& tokens, int64_t T) {
  const int64_t n = tokens.size() > 0 ? (int64_t(tokens.size()) - 1) / T : 0;
  TRELLIS_REQUIRE(n >= 1, "training data has {} tokens: too few for one sequence of {} (+1) tokens",
                  tokens.size(), T);
  return n;
}
}  // namespace

GlobalOrder::GlobalOrder(int64_t items, int64_t global_batch, uint64_t seed, bool shuffle)
    : n_(items), G_(global_batch), seed_(seed), shuffle_(shuffle) {
  TRELLIS_CHECK(items >= 1, "an order over no items");
}

const std::vector<int64_t>& GlobalOrder::order(int64_t epoch) {
  if (epoch == cached_epoch_) return order_;
  order_.resize(size_t(n_));
  std::iota(order_.begin(), order_.end(), int64_t(0));
  if (shuffle_) {
    // Fisher-Yates driven by a counter-based stream keyed by (seed, epoch): any rank can rebuild
    // any epoch's order without replaying earlier ones.
    const uint64_t stream = 0x5eed0000ull + uint64_t(epoch);
    for (int64_t i = n_ - 1; i > 0; --i) {
      const int64_t k = int64_t(philox_uniform(seed_, stream, uint64_t(i)) * double(i + 1));
      std::swap(order_[size_t(i)], order_[size_t(std::min(k, i))]);
    }
  }
  cached_epoch_ = epoch;
  return order_;
}

int64_t GlobalOrder::item(int64_t step, int64_t j) {
  const int64_t pos = step * G_ + j;
  return order(pos / n_)[size_t(pos % n_)];
}

BatchLoader::BatchLoader(const std::vector<uint16_t>& tokens, int64_t seq_len, int64_t global_batch,
                         uint64_t seed, bool shuffle)
    : tokens_(tokens),
      T_(seq_len),
      order_(window_count(tokens, seq_len), global_batch, seed, shuffle) {}

void BatchLoader::fill(int64_t step, int64_t first, int64_t rows, int32_t* inputs,
                       int32_t* targets) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* w = tokens_.data() + window(step, first + r) * T_;
    for (int64_t t = 0; t < T_; ++t) {
      inputs[r * T_ + t] = w[t];
      targets[r * T_ + t] = w[t + 1];
    }
  }
}

void fill_eval_windows(const std::vector<uint16_t>& tokens, int64_t T, int64_t first, int64_t rows,
                       int32_t* inputs, int32_t* targets) {
  const int64_t need = (first + rows) * T + 1;
  TRELLIS_REQUIRE(int64_t(tokens.size()) >= need,
                  "evaluation needs {} tokens ({} windows of {}) but the data holds {}", need,
                  first + rows, T, tokens.size());
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* w = tokens.data() + (first + r) * T;
    for (int64_t t = 0; t < T; ++t) {
      inputs[r * T + t] = w[t];
      targets[r * T + t] = w[t + 1];
    }
  }
}

}  // namespace trellis
