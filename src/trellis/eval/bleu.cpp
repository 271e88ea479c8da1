#include "trellis/eval/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "trellis/core/error.h"

namespace trellis {

namespace {

// ---------------------------------------------------------------------------------------------
// Text as sacreBLEU (Python) sees it: code points, Python's whitespace, Python's str methods.

// Strict UTF-8 (as Python's decoder: no overlong forms, no surrogates, at most U+10FFFF).
std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len = 0;
    char32_t cp = 0, min = 0;
    if (b0 < 0x80) {
      len = 1, cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    }
    TRELLIS_REQUIRE(len > 0 && i + size_t(len) <= s.size(),
                    "text is not valid UTF-8 (byte {} of the line)", i + 1);
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + size_t(k)]);
      TRELLIS_REQUIRE((b & 0xC0) == 0x80, "text is not valid UTF-8 (byte {} of the line)", i + 1);
      cp = (cp << 6) | (b & 0x3F);
    }
    TRELLIS_REQUIRE(cp >= min && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF),
                    "text is not valid UTF-8 (byte {} of the line)", i + 1);
    out.push_back(cp);
    i += size_t(len);
  }
  return out;
}

// A line of the corpus: hypothesis i (set < 0) or line i of reference set `set`, named on error.
std::u32string decode_line(const std::string& line, int set, size_t i) {
  try {
    return decode_utf8(line);
  } catch (const Error& e) {
    if (set < 0) TRELLIS_REQUIRE(false, "hypothesis line {}: {}", i + 1, e.what());
    TRELLIS_REQUIRE(false, "reference {} line {}: {}", set + 1, i + 1, e.what());
  }
  return {};
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out.push_back(char(c));
    } else if (c < 0x800) {
      out.push_back(char(0xC0 | (c >> 6)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(char(0xE0 | (c >> 12)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else {
      out.push_back(char(0xF0 | (c >> 18)));
      out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// Python's str.isspace(), which str.split() and str.rstrip() use.
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::vector<std::u32string> py_split(const std::u32string& s) {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && py_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !py_space(s[j])) ++j;
    if (j > i) out.emplace_back(s, i, j - i);
    i = j;
  }
  return out;
}

std::u32string py_rstrip(std::u32string s) {
  while (!s.empty() && py_space(s.back())) s.pop_back();
  return s;
}

// str.replace: non-overlapping occurrences, left to right.
std::u32string replace_all(const std::u32string& s, const std::u32string& from,
                           const std::u32string& to) {
  std::u32string out;
  size_t i = 0;
  for (size_t at; (at = s.find(from, i)) != std::u32string::npos; i = at + from.size())
    out.append(s, i, at - i).append(to);
  return out.append(s, i, std::u32string::npos);
}

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }

// re.sub(r'(A)(B)', repl, s) for two single-character classes: matches do not overlap, and the
// scan goes on after a match's second character.
template <class A, class B, class Emit>
std::u32string sub_pairs(const std::u32string& s, A first, B second, Emit emit) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && first(s[i]) && second(s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

std::u32string tokenize_13a_u32(std::u32string line) {
  // mteval-v13a's language-independent part.
  line = replace_all(line, U"<skipped>", U"");
  line = replace_all(line, U"-\n", U"");
  line = replace_all(line, U"\n", U" ");
  if (line.find(U'&') != std::u32string::npos) {
    line = replace_all(line, U"&quot;", U"\"");
    line = replace_all(line, U"&amp;", U"&");
    line = replace_all(line, U"&lt;", U"<");
    line = replace_all(line, U"&gt;", U">");
  }
  line = U" " + line + U" ";
  // Punctuation and symbols become tokens: ASCII 0x20-0x26, ( ) * +, / and 0x3A-0x40,
  // 0x5B-0x60, 0x7B-0x7E (not ' , - . nor letters and digits).
  std::u32string spaced;
  spaced.reserve(line.size() * 2);
  for (char32_t c : line) {
    const bool symbol = (c >= 0x20 && c <= 0x26) || (c >= 0x28 && c <= 0x2B) || c == 0x2F ||
                        (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                        (c >= 0x7B && c <= 0x7E);
    if (symbol)
      spaced.append({U' ', c, U' '});
    else
      spaced.push_back(c);
  }
  auto not_digit = [](char32_t c) { return !is_digit(c); };
  auto period_comma = [](char32_t c) { return c == U'.' || c == U','; };
  auto is_dash = [](char32_t c) { return c == U'-'; };
  auto split_after = [](std::u32string& o, char32_t a, char32_t b) {
    o.append({a, U' ', b, U' '});
  };
  auto split_around = [](std::u32string& o, char32_t a, char32_t b) {
    o.append({U' ', a, U' ', b});
  };
  // Period and comma unless preceded by a digit, then unless followed by one; a dash after a digit.
  spaced = sub_pairs(spaced, not_digit, period_comma, split_after);
  spaced = sub_pairs(spaced, period_comma, not_digit, split_around);
  spaced = sub_pairs(spaced, is_digit, is_dash, split_after);
  std::u32string out;
  for (const auto& w : py_split(spaced)) {
    if (!out.empty()) out += U' ';
    out += w;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// BLEU

using NgramCounts = std::vector<std::unordered_map<std::u32string, int64_t>>;  // per order - 1

// Tokens joined by single spaces: the key of an n-gram (tokens hold no whitespace).
NgramCounts word_ngrams(const std::vector<std::u32string>& tokens, int max_order) {
  NgramCounts counts(static_cast<size_t>(max_order));
  for (int n = 1; n <= max_order; ++n) {
    for (size_t i = 0; i + size_t(n) <= tokens.size(); ++i) {
      std::u32string key = tokens[i];
      for (size_t k = 1; k < size_t(n); ++k) key.append(1, U' ').append(tokens[i + k]);
      ++counts[size_t(n - 1)][key];
    }
  }
  return counts;
}

std::vector<std::u32string> bleu_tokens(const std::u32string& line, const BleuOptions& opt) {
  std::u32string s = py_rstrip(line);
  if (opt.tokenize == BleuOptions::Tokenize::V13a) s = tokenize_13a_u32(std::move(s));
  return py_split(s);
}

// The reference length a hypothesis of hyp_len tokens is compared with: the closest, the shorter
// one on a tie.
int64_t closest_ref_len(int64_t hyp_len, const std::vector<int64_t>& ref_lens) {
  int64_t best = -1, best_diff = -1;
  for (int64_t r : ref_lens) {
    const int64_t diff = std::llabs(hyp_len - r);
    if (best_diff < 0 || diff < best_diff || (diff == best_diff && r < best)) {
      best_diff = diff;
      best = r;
    }
  }
  return best;
}

double floored_log(double p) { return p == 0.0 ? -9999999999.0 : std::log(p); }

void check_corpus(const std::vector<std::string>& hyps, const ReferenceSets& refs) {
  TRELLIS_REQUIRE(!refs.empty(), "no reference set given");
  for (size_t k = 0; k < refs.size(); ++k)
    TRELLIS_REQUIRE(refs[k].size() == hyps.size(),
                    "reference set {} has {} lines, the hypotheses {}", k + 1, refs[k].size(),
                    hyps.size());
}

// ---------------------------------------------------------------------------------------------
// chrF

using CharCounts = std::vector<std::unordered_map<std::u32string, int64_t>>;  // per order - 1

CharCounts char_ngrams(std::u32string s, const ChrfOptions& opt) {
  if (!opt.whitespace) {
    std::u32string joined;
    for (const auto& w : py_split(s)) joined += w;
    s = std::move(joined);
  }
  CharCounts counts(size_t(opt.char_order));
  for (size_t n = 1; n <= size_t(opt.char_order); ++n)
    for (size_t i = 0; i + n <= s.size(); ++i) ++counts[n - 1][s.substr(i, n)];
  return counts;
}

// Per order: hypothesis n-grams (0 when the reference has none of that order), reference n-grams,
// matches.
std::vector<int64_t> chrf_statistics(const CharCounts& hyp, const CharCounts& ref) {
  std::vector<int64_t> stats;
  for (size_t n = 0; n < hyp.size(); ++n) {
    int64_t hyp_count = 0, ref_count = 0, match = 0;
    for (const auto& [gram, c] : hyp[n]) {
      hyp_count += c;
      auto it = ref[n].find(gram);
      if (it != ref[n].end()) match += std::min(c, it->second);
    }
    for (const auto& [gram, c] : ref[n]) ref_count += c;
    stats.push_back(ref[n].empty() ? 0 : hyp_count);
    stats.push_back(ref_count);
    stats.push_back(match);
  }
  return stats;
}

double chrf_from_statistics(const std::vector<int64_t>& stats, const ChrfOptions& opt) {
  const double eps = 1e-16, factor = opt.beta * opt.beta;
  const size_t orders = stats.size() / 3;
  double eps_score = 0.0, avg_prec = 0.0, avg_rec = 0.0;
  int effective = 0;
  for (size_t i = 0; i < orders; ++i) {
    const double n_hyp = double(stats[3 * i]), n_ref = double(stats[3 * i + 1]),
                 n_match = double(stats[3 * i + 2]);
    const double prec = n_hyp > 0 ? n_match / n_hyp : eps;
    const double rec = n_ref > 0 ? n_match / n_ref : eps;
    const double denom = factor * prec + rec;
    eps_score += denom > 0 ? (1 + factor) * prec * rec / denom : eps;
    if (n_hyp > 0 && n_ref > 0) {
      avg_prec += prec;
      avg_rec += rec;
      ++effective;
    }
  }
  if (opt.eps_smoothing) return 100.0 * eps_score / double(orders);
  if (effective == 0) return 0.0;
  avg_prec /= effective;
  avg_rec /= effective;
  if (avg_prec + avg_rec == 0.0) return 0.0;
  return 100.0 * (1 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec);
}

}  // namespace

std::string tokenize_13a(const std::string& line) {
  return encode_utf8(tokenize_13a_u32(decode_utf8(line)));
}

BleuScore bleu_from_statistics(std::vector<double> correct, std::vector<double> total,
                               int64_t sys_len, int64_t ref_len, const BleuOptions& opt) {
  const size_t N = size_t(opt.max_order);
  TRELLIS_REQUIRE(opt.max_order >= 1 && correct.size() == N && total.size() == N,
                  "BLEU statistics need {} orders", opt.max_order);
  using Smooth = BleuOptions::Smooth;
  double smooth_value = opt.smooth_value;
  if (smooth_value < 0) smooth_value = opt.smooth == Smooth::AddK ? 1.0 : 0.1;

  BleuScore s;
  s.sys_len = sys_len;
  s.ref_len = ref_len;
  if (sys_len < ref_len) s.bp = sys_len > 0 ? std::exp(1.0 - double(ref_len) / double(sys_len)) : 0;
  s.precisions.assign(N, 0.0);
  s.counts = correct;
  s.totals = total;
  // No match of any order: 0, whatever the smoothing (sacreBLEU #141).
  if (std::all_of(correct.begin(), correct.end(), [](double c) { return c == 0; })) return s;

  double exp_factor = 1.0;
  size_t orders = N;
  for (size_t n = 0; n < N; ++n) {
    if (opt.smooth == Smooth::AddK && n > 0) {
      correct[n] += smooth_value;
      total[n] += smooth_value;
    }
    // Longer n-grams than any hypothesis has: their precision stays 0 (so BLEU is 0 unless only
    // the effective orders count).
    if (total[n] == 0) break;
    if (opt.effective_order) orders = n + 1;
    if (correct[n] == 0) {
      if (opt.smooth == Smooth::Exp) {
        exp_factor *= 2;
        s.precisions[n] = 100.0 / (exp_factor * total[n]);
      } else if (opt.smooth == Smooth::Floor) {
        s.precisions[n] = 100.0 * smooth_value / total[n];
      }
    } else {
      s.precisions[n] = 100.0 * correct[n] / total[n];
    }
  }
  s.counts = correct;
  s.totals = total;
  double log_sum = 0.0;
  for (size_t n = 0; n < orders; ++n) log_sum += floored_log(s.precisions[n]);
  s.score = s.bp * std::exp(log_sum / double(orders));
  return s;
}

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const ReferenceSets& refs,
                      const BleuOptions& opt) {
  check_corpus(hyps, refs);
  TRELLIS_REQUIRE(opt.max_order >= 1, "BLEU max order must be >= 1 (got {})", opt.max_order);
  const size_t N = size_t(opt.max_order);
  std::vector<double> correct(N, 0.0), total(N, 0.0);
  int64_t sys_len = 0, ref_len = 0;
  for (size_t i = 0; i < hyps.size(); ++i) {
    // Each n-gram may match as often as it occurs in the reference that has it most often.
    NgramCounts ref_max(N);
    std::vector<int64_t> ref_lens;
    for (size_t k = 0; k < refs.size(); ++k) {
      const auto tokens = bleu_tokens(decode_line(refs[k][i], int(k), i), opt);
      ref_lens.push_back(int64_t(tokens.size()));
      NgramCounts c = word_ngrams(tokens, opt.max_order);
      for (size_t n = 0; n < N; ++n)
        for (const auto& [gram, count] : c[n]) {
          int64_t& m = ref_max[n][gram];
          m = std::max(m, count);
        }
    }
    const auto tokens = bleu_tokens(decode_line(hyps[i], -1, i), opt);
    const NgramCounts hyp = word_ngrams(tokens, opt.max_order);
    for (size_t n = 0; n < N; ++n)
      for (const auto& [gram, count] : hyp[n]) {
        total[n] += double(count);
        auto it = ref_max[n].find(gram);
        if (it != ref_max[n].end()) correct[n] += double(std::min(count, it->second));
      }
    sys_len += int64_t(tokens.size());
    ref_len += closest_ref_len(int64_t(tokens.size()), ref_lens);
  }
  return bleu_from_statistics(std::move(correct), std::move(total), sys_len, ref_len, opt);
}

double corpus_chrf(const std::vector<std::string>& hyps, const ReferenceSets& refs,
                   const ChrfOptions& opt) {
  check_corpus(hyps, refs);
  TRELLIS_REQUIRE(opt.char_order >= 1, "chrF character order must be >= 1 (got {})",
                  opt.char_order);
  std::vector<int64_t> sum(3 * size_t(opt.char_order), 0);
  for (size_t i = 0; i < hyps.size(); ++i) {
    const CharCounts hyp = char_ngrams(decode_line(hyps[i], -1, i), opt);
    std::vector<int64_t> best;
    double best_f = -1.0;
    for (size_t k = 0; k < refs.size(); ++k) {
      std::vector<int64_t> stats =
          chrf_statistics(hyp, char_ngrams(decode_line(refs[k][i], int(k), i), opt));
      const double f = chrf_from_statistics(stats, opt);
      if (f > best_f) {
        best_f = f;
        best = std::move(stats);
      }
    }
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += best[k];
  }
  return chrf_from_statistics(sum, opt);
}

}  // namespace trellis
