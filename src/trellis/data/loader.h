#pragma once
// Global-batch addressing (DESIGN invariant 2). The token stream is cut into windows of T+1 tokens
// (stride T); sequence j of global step s is window order[(s*G + j) mod W], where the order is a
// seeded permutation per epoch (epoch = (s*G + j) / W) or the identity when shuffle is off. A DP
// rank or micro-batch just asks for its rows; nothing depends on the layout.
#include <cstdint>
#include <vector>

#include "trellis/data/token_stream.h"

namespace trellis {

// Which item (window or example) sequence j of global step s reads: item order[(s*G + j) mod n],
// the order a seeded permutation per epoch ((s*G + j) / n), or the identity without shuffling.
// Up to kStoredOrderMax items the permutation is a stored Fisher-Yates shuffle (at most 8 MB; the
// order every earlier trellis used, so existing runs resume onto the same data); beyond, it is
// computed per position (a Feistel network over the next power of four, cycle-walked into
// [0, n)) and never stored, so its cost does not grow with the corpus. Either way any rank can
// compute any epoch's order without replaying earlier ones.
class GlobalOrder {
 public:
  static constexpr int64_t kStoredOrderMax = int64_t(1) << 20;
  // `stream` keys the permutations (mixtures give each dataset its own).
  GlobalOrder(int64_t items, int64_t global_batch, uint64_t seed, bool shuffle,
              uint64_t stream = 0x5eed0000ull);
  int64_t items() const { return n_; }
  int64_t item(int64_t step, int64_t j) const { return at(step * G_ + j); }
  // The item at position pos of the endless sequence of epochs.
  int64_t at(int64_t pos) const;

 private:
  uint64_t permute(uint64_t epoch, uint64_t x) const;
  const std::vector<int64_t>& stored(int64_t epoch) const;
  int64_t n_, G_;
  uint64_t seed_, stream_;
  bool shuffle_;
  int half_bits_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

class BatchLoader {
 public:
  BatchLoader(const TokenStream& tokens, int64_t seq_len, int64_t global_batch, uint64_t seed,
              bool shuffle);
  int64_t windows() const { return order_.items(); }
  // Fills inputs/targets (rows*T each) with sequences [first, first+rows) of global step `step`
  // (0-based).
  void fill(int64_t step, int64_t first, int64_t rows, int32_t* inputs, int32_t* targets) const;
  // Window index of sequence j of step s.
  int64_t window(int64_t step, int64_t j) const { return order_.item(step, j); }

 private:
  const TokenStream& tokens_;
  int64_t T_;
  GlobalOrder order_;
};

// Windows of T+1 tokens (stride T) in a stream; at least one, or an input error.
int64_t window_count(const TokenStream& tokens, int64_t T);
// Window w of a stream into one row of inputs/targets (T each).
void fill_window(const TokenStream& tokens, int64_t T, int64_t w, int32_t* inputs,
                 int32_t* targets);
// Document starts of window w's inputs (tokens [w*T, w*T + T)) into doc_start[0, T): for each
// position, where its document starts in the window (0 for those before the window's first
// start: the window cuts the document there). Needs the stream's document indexes. The target of
// a document's last input is the next document's first token: it still counts in the loss (as in
// PyTorch and Megatron), and prepare puts GPT-2's <|endoftext|> there, so it predicts the end.
void window_doc_starts(const TokenStream& tokens, int64_t T, int64_t w, int32_t* doc_start);
// Fixed evaluation windows: window i = tokens [i*T, i*T + T] (used by eval and validation).
void fill_eval_windows(const TokenStream& tokens, int64_t T, int64_t first, int64_t rows,
                       int32_t* inputs, int32_t* targets);

}  // namespace trellis
