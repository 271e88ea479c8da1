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

struct Sentence {
  std::vector<Hypothesis> alive = {{}};
  std::vector<std::pair<double, std::vector<int>>> finished;  // (score, tokens)
  bool done = false;
};

// One step's rows: (sentence, hypothesis) for every alive hypothesis of every unfinished
// sentence, and the positions the uncached path pads them to (the longest need).
struct StepRows {
  std::vector<std::pair<size_t, size_t>> who;
  int64_t T = 0;
};

StepRows step_rows(const std::vector<Sentence>& sent,
                   const std::vector<std::span<const uint32_t>>& sources, int64_t t) {
  StepRows rows;
  rows.T = t + 1;
  for (size_t i = 0; i < sent.size(); ++i) {
    if (sent[i].done) continue;
    rows.T = std::max<int64_t>(rows.T, int64_t(sources[i].size()) + 1);
    for (size_t h = 0; h < sent[i].alive.size(); ++h) rows.who.push_back({i, h});
  }
  return rows;
}

// Cached: each row's newest token decoded over the cache, whose row b is hypothesis who[b]; the
// logits land in cache.work.logits. last holds the tokens the step's spans point into.
void decode_cached(ModelChunk& model, KVCache& cache, std::vector<int32_t>& last,
                   const std::vector<Sentence>& sent, const StepRows& rows, int special) {
  const int64_t B = int64_t(rows.who.size());
  last.resize(size_t(B));
  std::vector<std::span<const int32_t>> step;
  for (int64_t b = 0; b < B; ++b) {
    const Hypothesis& hyp = sent[rows.who[size_t(b)].first].alive[rows.who[size_t(b)].second];
    last[size_t(b)] = hyp.tokens.empty() ? special : hyp.tokens.back();
    step.push_back({last.data() + b, 1});
  }
  model.decode(cache, step);
}

// Uncached: the whole model over [S] y_1 .. y_t of every row, padded to rows.T; the logits at
// position t.
std::vector<float> logits_uncached(ModelChunk& model, Context& ctx,
                                   const std::vector<Sentence>& sent,
                                   const std::vector<std::span<const uint32_t>>& sources,
                                   const StepRows& rows, int64_t t, int special) {
  const int64_t B = int64_t(rows.who.size()), T = rows.T;
  model.prepare(ctx, B, T);
  ctx.src_tokens.assign(size_t(B * T), special);
  ctx.lengths.assign(size_t(B), 1);
  ctx.labels.assign(size_t(B), -1);
  std::vector<int64_t> at;
  for (int64_t b = 0; b < B; ++b) {
    const auto& src = sources[rows.who[size_t(b)].first];
    const Hypothesis& hyp = sent[rows.who[size_t(b)].first].alive[rows.who[size_t(b)].second];
    std::copy(src.begin(), src.end(), ctx.src_tokens.begin() + b * T);
    ctx.lengths[size_t(b)] = int32_t(src.size() + 1);
    int32_t* row = ctx.tokens.data() + b * T;
    std::fill_n(row, T, special);
    std::copy(hyp.tokens.begin(), hyp.tokens.end(), row + 1);
    at.push_back(b * T + t);
  }
  return model.logits_at(ctx, at);
}

// One beam step of sentence s, whose alive hypotheses are the logits' rows [row0, row0 +
// alive): each offers its 2 * beam best continuations; the best of them are kept until `beam`
// continue, so that enough survive even when some of them end. parents gets the cache row each
// continuing hypothesis extends.
void advance(Sentence& s, const float* logits, size_t row0, int64_t V, int64_t beam,
             const DecodeOptions& o, std::vector<int64_t>& parents) {
  struct Candidate {
    double logp;
    size_t from;
    int token;
  };
  std::vector<Candidate> cand;
  for (size_t h = 0; h < s.alive.size(); ++h) {
    const std::vector<double> lp = log_softmax(logits + int64_t(row0 + h) * V, V);
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

// Each sentence's best-scoring finished hypothesis; the ones still alive end here (out of room).
std::vector<std::vector<int>> best_of(std::vector<Sentence>& sent, double alpha) {
  std::vector<std::vector<int>> out;
  for (Sentence& s : sent) {
    for (const Hypothesis& h : s.alive)
      s.finished.push_back({h.logp / length_penalty(int64_t(h.tokens.size()), alpha), h.tokens});
    const auto best =
        std::max_element(s.finished.begin(), s.finished.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back(best->second);
  }
  return out;
}

}  // namespace

std::vector<std::vector<int>> translate(ModelChunk& model,
                                        const std::vector<std::span<const uint32_t>>& sources,
                                        const DecodeOptions& o) {
  const int64_t beam = std::max(1, o.beam), V = model.config().vocab_size, n = sources.size();
  // The decoder's input is [S] y_1 .. y_t: generating position t needs t + 1 <= T.
  const int64_t max_len = std::min(o.max_len > 0 ? o.max_len : o.T, o.T);
  for (const auto& src : sources)
    TRELLIS_REQUIRE(int64_t(src.size()) + 1 <= o.T,
                    "a source of {} tokens (with its end token) does not fit {} positions",
                    src.size(), o.T);
  std::vector<Sentence> sent(static_cast<size_t>(n));
  KVCache cache;
  if (o.cache) cache = model.encode(sources, max_len, o.special);
  Context ctx;
  std::vector<int32_t> last;  // each row's newest token (cached)
  for (int64_t t = 0; t < max_len; ++t) {
    const StepRows rows = step_rows(sent, sources, t);
    if (rows.who.empty()) break;
    std::vector<float> uncached;
    if (o.cache)
      decode_cached(model, cache, last, sent, rows, o.special);
    else
      uncached = logits_uncached(model, ctx, sent, sources, rows, t, o.special);
    const std::vector<float>& logits = o.cache ? cache.work.logits : uncached;
    std::vector<int64_t> parents;  // the cache row each next hypothesis continues
    for (size_t first = 0; first < rows.who.size();) {
      Sentence& s = sent[rows.who[first].first];
      const size_t alive = s.alive.size();
      advance(s, logits.data(), first, V, beam, o, parents);
      first += alive;
    }
    if (o.cache) cache.select(parents);
  }
  return best_of(sent, o.alpha);
}

}  // namespace trellis
