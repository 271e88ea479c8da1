#pragma once
// Global-batch addressing (DESIGN invariant 2). The token stream is cut into windows of T+1 tokens
// (stride T); sequence j of global step s is window order[(s*G + j) mod W], where the order is a
// seeded permutation per epoch (epoch = (s*G + j) / W) or the identity when shuffle is off. A DP
// rank or micro-batch just asks for its rows; nothing depends on the layout.
#include <cstdint>
#include <vector>

namespace trellis {

// Which item (window or example) sequence j of global step s reads: item order[(s*G + j) mod n],
// the order a seeded permutation per epoch ((s*G + j) / n), or the identity without shuffling.
class GlobalOrder {
 public:
  GlobalOrder(int64_t items, int64_t global_batch, uint64_t seed, bool shuffle);
  int64_t items() const { return n_; }
  int64_t item(int64_t step, int64_t j);

 private:
  const std::vector<int64_t>& order(int64_t epoch);
  int64_t n_, G_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

class BatchLoader {
 public:
  BatchLoader(const std::vector<uint16_t>& tokens, int64_t seq_len, int64_t global_batch,
              uint64_t seed, bool shuffle);
  int64_t windows() const { return order_.items(); }
  // Fills inputs/targets (rows*T each) with sequences [first, first+rows) of global step `step`
  // (0-based).
  void fill(int64_t step, int64_t first, int64_t rows, int32_t* inputs, int32_t* targets);
  // Window index of sequence j of step s.
  int64_t window(int64_t step, int64_t j) { return order_.item(step, j); }

 private:
  const std::vector<uint16_t>& tokens_;
  int64_t T_;
  GlobalOrder order_;
};

// Fixed evaluation windows: window i = tokens [i*T, i*T + T] (used by eval and validation).
void fill_eval_windows(const std::vector<uint16_t>& tokens, int64_t T, int64_t first, int64_t rows,
                       int32_t* inputs, int32_t* targets);

}  // namespace trellis
