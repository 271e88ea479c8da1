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

double length_penalty(int64_t len, double alpha) {
  return std::pow((5.0 + double(len)) / 6.0, alpha);
}

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

std::vector<std::vector<int>> translate(Transformer& model,
                                        const std::vector<std::span<const uint32_t>>& sources,
                                        const DecodeOptions& o) {
  const int64_t beam = std::max(1, o.beam), V = model.config().vocab_size, n = sources.size();
  // The decoder's input is [S] y_1 .. y_t: generating position t needs t + 1 <= T.
  const int64_t max_len = std::min(o.max_len > 0 ? o.max_len : o.T, o.T);
  for (const auto& src : sources)
    TRELLIS_REQUIRE(int64_t(src.size()) + 1 <= o.T,
                    "a source of {} tokens (with its end token) does not fit {} positions",
                    src.size(), o.T);
  struct Sentence {
    std::vector<Hypothesis> alive = {{}};
    std::vector<std::pair<double, std::vector<int>>> finished;  // (score, tokens)
    bool done = false;
  };
  std::vector<Sentence> sent(static_cast<size_t>(n));
  // Cached: row b of the cache is hypothesis who[b] of the step.
  KVCache cache;
  if (o.cache) cache = model.encode(sources, max_len, o.special);
  Context ctx;
  std::vector<int32_t> last;  // each row's newest token (cached)
  for (int64_t t = 0; t < max_len; ++t) {
    // One row per alive hypothesis of every unfinished sentence, padded to the longest need.
    std::vector<std::pair<size_t, size_t>> who;  // (sentence, hypothesis)
    int64_t T = t + 1;
    for (size_t i = 0; i < sent.size(); ++i) {
      if (sent[i].done) continue;
      T = std::max<int64_t>(T, int64_t(sources[i].size()) + 1);
      for (size_t h = 0; h < sent[i].alive.size(); ++h) who.push_back({i, h});
    }
    if (who.empty()) break;
    const int64_t B = int64_t(who.size());
    std::vector<float> uncached;
    if (o.cache) {
      last.resize(size_t(B));
      std::vector<std::span<const int32_t>> step;
      for (int64_t b = 0; b < B; ++b) {
        const Hypothesis& hyp = sent[who[size_t(b)].first].alive[who[size_t(b)].second];
        last[size_t(b)] = hyp.tokens.empty() ? o.special : hyp.tokens.back();
        step.push_back({last.data() + b, 1});
      }
      model.decode(cache, step);
    } else {
      model.prepare(ctx, B, T);
      ctx.src_tokens.assign(size_t(B * T), o.special);
      ctx.lengths.assign(size_t(B), 1);
      ctx.labels.assign(size_t(B), -1);
      std::vector<int64_t> rows;
      for (int64_t b = 0; b < B; ++b) {
        const auto& src = sources[who[size_t(b)].first];
        const Hypothesis& hyp = sent[who[size_t(b)].first].alive[who[size_t(b)].second];
        std::copy(src.begin(), src.end(), ctx.src_tokens.begin() + b * T);
        ctx.lengths[size_t(b)] = int32_t(src.size() + 1);
        int32_t* row = ctx.tokens.data() + b * T;
        std::fill_n(row, T, o.special);
        std::copy(hyp.tokens.begin(), hyp.tokens.end(), row + 1);
        rows.push_back(b * T + t);
      }
      uncached = model.logits_at(ctx, rows);
    }
    const std::vector<float>& logits = o.cache ? cache.work.logits : uncached;
    std::vector<int64_t> parents;  // the cache row each next hypothesis continues
    // Each alive hypothesis offers its 2 * beam best continuations; the best of them are kept
    // until `beam` continue, so that enough survive even when some of them end.
    struct Candidate {
      double logp;
      size_t from;
      int token;
    };
    for (size_t first = 0; first < who.size();) {
      const size_t i = who[first].first;
      Sentence& s = sent[i];
      std::vector<Candidate> cand;
      for (size_t h = 0; h < s.alive.size(); ++h) {
        const std::vector<double> lp = log_softmax(logits.data() + int64_t(first + h) * V, V);
        std::vector<int> idx(lp.size());
        std::iota(idx.begin(), idx.end(), 0);
        const size_t k = std::min<size_t>(size_t(2 * beam), idx.size());
        // Ties go to the lower id, so both paths rank equal scores alike.
        std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(), [&](int a, int b) {
          return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b);
        });
        for (size_t j = 0; j < k; ++j)
          cand.push_back({s.alive[h].logp + lp[size_t(idx[j])], h, idx[j]});
      }
      const size_t row0 = first;
      first += s.alive.size();
      std::stable_sort(cand.begin(), cand.end(),
                       [](const Candidate& a, const Candidate& b) { return a.logp > b.logp; });
      std::vector<Hypothesis> next;
      for (const Candidate& c : cand) {
        if (int64_t(next.size()) == beam) break;
        std::vector<int> tokens = s.alive[c.from].tokens;
        if (c.token == o.special) {
          const int64_t len = int64_t(tokens.size()) + 1;  // with the end token
          s.finished.push_back({c.logp / length_penalty(len, o.alpha), std::move(tokens)});
        } else {
          tokens.push_back(c.token);
          next.push_back({std::move(tokens), c.logp});
          parents.push_back(int64_t(row0 + c.from));
        }
      }
      s.alive = std::move(next);
      s.done = int64_t(s.finished.size()) >= beam || s.alive.empty();
      if (s.done) parents.resize(parents.size() - s.alive.size());  // the sentence leaves
    }
    if (o.cache) cache.select(parents);
  }
  std::vector<std::vector<int>> out;
  for (Sentence& s : sent) {
    for (const Hypothesis& h : s.alive)  // out of room: they end here
      s.finished.push_back({h.logp / length_penalty(int64_t(h.tokens.size()), o.alpha), h.tokens});
    const auto best =
        std::max_element(s.finished.begin(), s.finished.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back(best->second);
  }
  return out;
}

}  // namespace trellis
