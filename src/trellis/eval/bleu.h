#pragma once
// Corpus BLEU and chrF as sacreBLEU 2.x computes them (github.com/mjpost/sacrebleu), so scores
// from trellis can be put next to published ones: the same tokenizer (13a = mteval-v13a), the
// same smoothing, the same handling of several references. Scores are on sacreBLEU's 0-100 scale.
//
// Input strings are UTF-8 (invalid UTF-8 is an input error); characters are Unicode code points
// and "whitespace" is Python's str.isspace() set, as in sacreBLEU.
#include <cstdint>
#include <string>
#include <vector>

namespace trellis {

// Reference sets as sacreBLEU takes them: refs[k][i] is the k-th reference of hypothesis i. Every
// set has one line per hypothesis; an empty line is an empty reference (length 0), not a missing
// one.
using ReferenceSets = std::vector<std::vector<std::string>>;

struct BleuOptions {
  enum class Tokenize { V13a, None };
  // exp: mteval-v13a's smoothing (sacreBLEU's default); floor and add-k: Chen & Cherry (2014)
  // methods 1 and 2.
  enum class Smooth { Exp, None, Floor, AddK };
  Tokenize tokenize = Tokenize::V13a;
  Smooth smooth = Smooth::Exp;
  double smooth_value = -1.0;  // < 0: the method's default (floor 0.1, add-k 1)
  int max_order = 4;
  // Average only over the orders the hypotheses have n-grams of (sentence-level BLEU).
  bool effective_order = false;
};

struct BleuScore {
  double score = 0.0;                // 0-100
  std::vector<double> counts;        // matched n-grams per order (after add-k smoothing)
  std::vector<double> totals;        // hypothesis n-grams per order (after add-k smoothing)
  std::vector<double> precisions;    // 0-100 per order
  double bp = 1.0;                   // brevity penalty
  int64_t sys_len = 0, ref_len = 0;  // tokens; ref_len sums each sentence's closest reference
};

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const ReferenceSets& refs,
                      const BleuOptions& opt = {});
// The score from summed statistics (sacreBLEU's BLEU.compute_bleu).
BleuScore bleu_from_statistics(std::vector<double> correct, std::vector<double> total,
                               int64_t sys_len, int64_t ref_len, const BleuOptions& opt = {});
// mteval-v13a tokenization of one line (sacreBLEU's Tokenizer13a).
std::string tokenize_13a(const std::string& line);

struct ChrfOptions {
  int char_order = 6;
  double beta = 2.0;
  bool whitespace = false;  // keep whitespace in the character n-grams
  // false (sacreBLEU's default): average precision and recall over the orders both sides have
  // n-grams of, then one F-score; true: the mean of per-order F-scores with chrF++.py's epsilon.
  bool eps_smoothing = false;
};

// Character n-gram statistics summed over the corpus (for each hypothesis the reference with the
// best sentence-level chrF counts; the first on a tie), then one F-beta score, 0-100.
double corpus_chrf(const std::vector<std::string>& hyps, const ReferenceSets& refs,
                   const ChrfOptions& opt = {});

}  // namespace trellis
