#include "trellis/model/decode.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "trellis/core/error.h"

namespace trellis {

namespace {

struct Hypothesis {
  std::vector<int> tokens;
  double logp = 0.0;
};

double length_penalty(int64_t len, double alpha) { return std::pow((5.0 + double(len)) / 6.0, alpha); }

// log softmax of one row, in double.
std::vector<double> log_softmax(const float* x, int64_t n) {
  const double mx = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
  return out;
}

}  // namespace

std::vector<int> translate(Transformer& model, std::span<const uint32_t> source,
                           const DecodeOptions& o) {
  const int64_t T = o.T, beam = std::max(1, o.beam), V = model.config().vocab_size;
  TRELLIS_REQUIRE(int64_t(source.size()) + 1 <= T,
                  "a source of {} tokens (with its end token) does not fit {} positions",
                  source.size(), T);
  // The decoder's input is [S] y_1 .. y_t: generating position t needs t + 1 <= T.
  const int64_t max_len = std::min(o.max_len > 0 ? o.max_len : T, T);
  Context ctx;
  model.prepare(ctx, beam, T);
  ctx.src_tokens.assign(size_t(beam * T), o.special);
  ctx.lengths.assign(size_t(beam), int32_t(source.size() + 1));
  ctx.labels.assign(size_t(beam), -1);
  for (int64_t b = 0; b < beam; ++b)
    std::copy(source.begin(), source.end(), ctx.src_tokens.begin() + b * T);

  std::vector<Hypothesis> alive = {{}};
  std::vector<std::pair<double, std::vector<int>>> finished;  // (score, tokens)
  for (int64_t t = 0; t < max_len && !alive.empty(); ++t) {
    std::vector<int64_t> rows;
    for (size_t r = 0; r < alive.size(); ++r) {
      int32_t* row = ctx.tokens.data() + int64_t(r) * T;
      std::fill_n(row, T, o.special);
      std::copy(alive[r].tokens.begin(), alive[r].tokens.end(), row + 1);
      rows.push_back(int64_t(r) * T + t);
    }
    const std::vector<float> logits = model.logits_at(ctx, rows);
    // Each alive hypothesis offers its 2 * beam best continuations; the best 2 * beam overall are
    // kept, so that `beam` survive even when some of them end.
    struct Candidate {
      double logp;
      size_t from;
      int token;
    };
    std::vector<Candidate> cand;
    for (size_t r = 0; r < alive.size(); ++r) {
      const std::vector<double> lp = log_softmax(logits.data() + int64_t(r) * V, V);
      std::vector<int> idx(static_cast<size_t>(V));
      std::iota(idx.begin(), idx.end(), 0);
      const size_t k = std::min<size_t>(size_t(2 * beam), idx.size());
      std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                        [&](int a, int b) { return lp[size_t(a)] > lp[size_t(b)]; });
      for (size_t j = 0; j < k; ++j)
        cand.push_back({alive[r].logp + lp[size_t(idx[j])], r, idx[j]});
    }
    std::stable_sort(cand.begin(), cand.end(),
                     [](const Candidate& a, const Candidate& b) { return a.logp > b.logp; });
    std::vector<Hypothesis> next;
    for (const Candidate& c : cand) {
      if (int64_t(next.size()) == beam) break;
      std::vector<int> tokens = alive[c.from].tokens;
      if (c.token == o.special) {
        const int64_t len = int64_t(tokens.size()) + 1;  // with the end token
        finished.push_back({c.logp / length_penalty(len, o.alpha), std::move(tokens)});
      } else {
        tokens.push_back(c.token);
        next.push_back({std::move(tokens), c.logp});
      }
    }
    alive = std::move(next);
    if (int64_t(finished.size()) >= beam) break;
  }
  for (const Hypothesis& h : alive)  // out of room: they end here
    finished.push_back({h.logp / length_penalty(int64_t(h.tokens.size()), o.alpha), h.tokens});
  const auto best = std::max_element(finished.begin(), finished.end(),
                                     [](const auto& a, const auto& b) { return a.first < b.first; });
  return best->second;
}

}  // namespace trellis
