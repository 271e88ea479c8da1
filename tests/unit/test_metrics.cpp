// eval/: BLEU and chrF against the values sacreBLEU publishes in its own tests and README
// (github.com/mjpost/sacrebleu: test/test_bleu.py, test/test_sentence_bleu.py, test/test_chrf.py,
// README.md "Using SacreBLEU from Python"); classification metrics against hand-computed examples.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/eval/bleu.h"
#include "trellis/eval/classification.h"

using namespace trellis;

namespace {

// README.md and test/test_bleu.py: two reference sets for three hypotheses.
const ReferenceSets kRefs = {
    {"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
    {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."},
};
const std::vector<std::string> kHyps = {"The dog bit the man.", "It wasn't surprising.",
                                        "The man had just bitten him."};

// sacreBLEU's raw_corpus_bleu (sacrebleu/compat.py): no tokenization, floor smoothing, effective
// order.
BleuOptions raw(double floor = 0.1) {
  BleuOptions o;
  o.tokenize = BleuOptions::Tokenize::None;
  o.smooth = BleuOptions::Smooth::Floor;
  o.smooth_value = floor;
  o.effective_order = true;
  return o;
}

}  // namespace

TEST(Bleu, DefaultsWithTwoReferences) {
  // test_bleu.py test_corpus_bleu_cases (EPSILON 1e-8); README: 82.4/50.0/45.5/37.5, BP 0.943,
  // hyp_len 17, ref_len 18.
  const BleuScore s = corpus_bleu(kHyps, kRefs);
  EXPECT_NEAR(s.score, 48.530827, 1e-6);
  EXPECT_EQ(s.sys_len, 17);
  EXPECT_EQ(s.ref_len, 18);
  const double prec[] = {82.4, 50.0, 45.5, 37.5};
  for (int n = 0; n < 4; ++n) EXPECT_NEAR(s.precisions[size_t(n)], prec[n], 0.05);
  EXPECT_NEAR(s.bp, 0.943, 5e-4);

  BleuOptions o;
  o.smooth = BleuOptions::Smooth::None;  // every order has matches: smoothing changes nothing
  EXPECT_NEAR(corpus_bleu(kHyps, kRefs, o).score, 48.530827, 1e-6);
  o = {};
  o.tokenize = BleuOptions::Tokenize::None;
  EXPECT_NEAR(corpus_bleu(kHyps, kRefs, o).score, 49.1919566, 1e-6);
  // Empty hypotheses are scored, not dropped.
  EXPECT_EQ(corpus_bleu({"", "", ""}, kRefs).score, 0.0);
}

TEST(Bleu, MaxOrder) {
  // test_bleu.py test_bleu_max_order (scores printed with 2 decimals).
  const double want[] = {77.65, 60.50, 53.93, 48.53, 46.14, 43.28};
  for (int order = 1; order <= 6; ++order) {
    BleuOptions o;
    o.max_order = order;
    EXPECT_NEAR(corpus_bleu(kHyps, kRefs, o).score, want[order - 1], 0.005) << order;
  }
}

TEST(Bleu, EmptyReferenceCountsAsReference) {
  // README "Variable Number of References": an empty reference line is a reference of length 0
  // (29.44, ref_len 19; with it replaced by the first set's line again, 48.53).
  ReferenceSets refs = kRefs;
  refs[0][0] = "";
  const BleuScore s = corpus_bleu(kHyps, refs);
  EXPECT_NEAR(s.score, 29.44, 0.005);
  EXPECT_EQ(s.ref_len, 19);
  EXPECT_EQ(s.sys_len, 17);
}

TEST(Bleu, ClosestReferenceLengthTiesGoToTheShorter) {
  // Hand-computed: every n-gram of "a b c d e" occurs in the second reference, so all precisions
  // are 100; 4 and 6 tokens are equally close to 5 and the shorter wins, so BP = 1 (with 6 it
  // would be exp(1 - 6/5)), in either order of the references.
  for (const auto& refs :
       {ReferenceSets{{"a b c d"}, {"a b c d e f"}}, ReferenceSets{{"a b c d e f"}, {"a b c d"}}}) {
    const BleuScore s = corpus_bleu({"a b c d e"}, refs);
    EXPECT_EQ(s.ref_len, 4);
    EXPECT_DOUBLE_EQ(s.score, 100.0);
  }
  // One reference of 6 tokens: the brevity penalty applies.
  EXPECT_NEAR(corpus_bleu({"a b c d e"}, {{"a b c d e f"}}).score, 100.0 * std::exp(1.0 - 1.2),
              1e-9);
}

TEST(Bleu, RawCorpusBleu) {
  // test_bleu.py test_raw_bleu_cases and test_case_effective_order (score / 100, EPSILON 1e-8).
  EXPECT_EQ(corpus_bleu({"this is a test", "another test"}, {{"ref1", "ref2"}}, raw(0.01)).score,
            0.0);
  EXPECT_NEAR(corpus_bleu({"this is a test"}, {{"this is a test"}}, raw(0.01)).score / 100, 1.0,
              1e-8);
  EXPECT_NEAR(corpus_bleu({"this is a fest"}, {{"this is a test"}}, raw(0.01)).score / 100,
              0.223606797749979, 1e-8);
  EXPECT_NEAR(corpus_bleu({"test"}, {{"a test"}}, raw(0.01)).score / 100, 0.3678794411714425, 1e-8);
  EXPECT_NEAR(corpus_bleu({"a test"}, {{"a test"}}, raw(0.01)).score / 100, 1.0, 1e-8);
  EXPECT_NEAR(corpus_bleu({"a little test"}, {{"a test"}}, raw(0.01)).score / 100,
              0.03218297948685433, 1e-8);
}

TEST(Bleu, StatisticsAndFloorOffset) {
  // test_bleu.py test_case_statistics and test_case_offset.
  const std::vector<std::string> hyp = {"am I am a character sequence"};
  const ReferenceSets ref = {{"I am a symbol string sequence a a"}};
  const BleuScore s = corpus_bleu(hyp, ref, raw(0.01));
  EXPECT_EQ(s.counts, (std::vector<double>{4, 2, 1, 0}));
  EXPECT_EQ(s.totals, (std::vector<double>{6, 5, 4, 3}));
  EXPECT_EQ(corpus_bleu(hyp, ref, raw(0.0)).score, 0.0);
  EXPECT_NEAR(corpus_bleu(hyp, ref, raw(0.1)).score / 100, 0.1555722182, 1e-8);
  BleuOptions default_floor = raw();
  default_floor.smooth_value = -1;  // the method's default, 0.1
  EXPECT_NEAR(corpus_bleu(hyp, ref, default_floor).score / 100, 0.1555722182, 1e-8);
}

TEST(Bleu, FromStatistics) {
  // test_bleu.py test_case_scoring (compute_bleu's default smoothing is 'none').
  BleuOptions none;
  none.smooth = BleuOptions::Smooth::None;
  EXPECT_NEAR(bleu_from_statistics({9, 7, 5, 3}, {10, 8, 6, 4}, 11, 11, none).score / 100,
              0.8375922397, 1e-8);
  // test_case_degenerate_stats: floor smoothing, all exactly 0.
  BleuOptions floor;
  floor.smooth = BleuOptions::Smooth::Floor;
  struct Case {
    std::vector<double> correct, total;
    int64_t sys, ref;
    double offset;
  };
  for (const Case& c : std::vector<Case>{{{0, 0, 0, 0}, {4, 4, 2, 1}, 0, 1, 0.0},
                                         {{0, 0, 0, 0}, {10, 11, 12, 0}, 14, 10, 0.0},
                                         {{0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0, 0.0},
                                         {{6, 5, 4, 0}, {6, 5, 4, 3}, 6, 6, 0.0},
                                         {{0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0, 0.1},
                                         {{0, 0, 0, 0}, {0, 0, 0, 0}, 1, 5, 0.01}}) {
    floor.smooth_value = c.offset;
    EXPECT_EQ(bleu_from_statistics(c.correct, c.total, c.sys, c.ref, floor).score, 0.0);
  }
}

TEST(Bleu, SmoothingWithMissingOrders) {
  // test_sentence_bleu.py (issue #98; EPSILON 1e-3): 13a tokens, effective order. The hypothesis
  // matches few 3- and 4-grams, so the smoothing decides the score; ţ and ț are different
  // characters.
  const std::vector<std::string> hyp = {
      "Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;"};
  const ReferenceSets ref = {{"producţia de zahăr brut se exprimă în zahăr alb;"}};
  struct Case {
    BleuOptions::Smooth smooth;
    double value, want;
  };
  using S = BleuOptions::Smooth;
  for (const Case& c : std::vector<Case>{{S::Exp, -1, 8.493},
                                         {S::None, -1, 0.0},
                                         {S::Floor, -1, 4.51688},
                                         {S::Floor, 0.1, 4.51688},
                                         {S::Floor, 0.5, 10.10},
                                         {S::AddK, -1, 14.882},
                                         {S::AddK, 1, 14.882},
                                         {S::AddK, 2, 21.389}}) {
    BleuOptions o;
    o.smooth = c.smooth;
    o.smooth_value = c.value;
    o.effective_order = true;
    EXPECT_NEAR(corpus_bleu(hyp, ref, o).score, c.want, 1e-3) << int(c.smooth) << " " << c.value;
  }
  BleuOptions none_tok;
  none_tok.tokenize = BleuOptions::Tokenize::None;
  none_tok.effective_order = true;
  EXPECT_NEAR(corpus_bleu(hyp, ref, none_tok).score, 7.347, 1e-3);

  // Issue #141: no match of any order is 0 whatever the smoothing.
  for (S s : {S::Exp, S::None, S::Floor, S::AddK}) {
    BleuOptions o;
    o.smooth = s;
    o.effective_order = true;
    EXPECT_EQ(corpus_bleu({"this is a cat"}, {{"okay thanks"}}, o).score, 0.0);
  }
}

TEST(Bleu, Tokenizer13a) {
  // mteval-v13a's rules (sacrebleu/tokenizers/tokenizer_13a.py, tokenizer_re.py), worked by
  // hand: symbols split off; period and comma split unless between digits; a dash split after a
  // digit; HTML entities and <skipped> undone; any Unicode whitespace separates.
  EXPECT_EQ(tokenize_13a("It wasn't surprising."), "It wasn't surprising .");
  EXPECT_EQ(tokenize_13a("Price: $3.50, or 1,000-2,000 (approx.) &amp;lt; x/y"),
            "Price : $ 3.50 , or 1,000 - 2,000 ( approx . ) < x / y");
  EXPECT_EQ(tokenize_13a("a-b 3-4 e.g. U.S. 5."), "a-b 3 - 4 e . g . U . S . 5 .");
  EXPECT_EQ(tokenize_13a("<skipped>end.\"Quote\","), "end . \" Quote \" ,");
  EXPECT_EQ(tokenize_13a("ţ, ș! naïve…"), "ţ , ș ! naïve…");
  EXPECT_EQ(tokenize_13a("tab\there  \u3000wide"), "tab here wide");
}

TEST(Bleu, BadInput) {
  EXPECT_THROW(corpus_bleu({"a"}, {}), Error);
  EXPECT_THROW(corpus_bleu({"a", "b"}, {{"a"}}), Error);
  try {
    corpus_bleu({"ok", "bad \xff byte"}, {{"ok", "fine"}});
    ADD_FAILURE() << "invalid UTF-8 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input);
    EXPECT_NE(std::string(e.what()).find("hypothesis line 2"), std::string::npos) << e.what();
  }
}

TEST(Chrf, DefaultsWithTwoReferences) {
  // README: chrF2 = 59.73 for the two reference sets (sacreBLEU's defaults: 6 character orders,
  // beta 2, whitespace removed, effective-order averaging). Each hypothesis is scored against its
  // best reference; against the first set alone the score is lower.
  EXPECT_NEAR(corpus_chrf(kHyps, kRefs), 59.73, 0.005);
  EXPECT_LT(corpus_chrf(kHyps, {kRefs[0]}), 59.73 - 1.0);
}

TEST(Chrf, EpsilonSmoothing) {
  // test_chrf.py test_cases: char order 6, beta 3, eps_smoothing (EPSILON 1e-4).
  ChrfOptions o;
  o.beta = 3;
  o.eps_smoothing = true;
  struct Case {
    std::vector<std::string> hyp, ref;
    double want;
  };
  for (const Case& c : std::vector<Case>{
           {{"abcdefg"}, {"hijklmnop"}, 0.0},
           {{"a"}, {"b"}, 0.0},
           {{""}, {"b"}, 0.0},
           {{""}, {"ref"}, 0.0},
           {{""}, {"reference"}, 0.0},
           {{"aa"}, {"ab"}, 8.3333},
           {{"a", "b"}, {"a", "c"}, 8.3333},
           {{"a"}, {"a"}, 16.6667},
           {{"a b c"}, {"a b c"}, 50.0},
           {{"a b c"}, {"abc"}, 50.0},
           {{" risk assessment must be made of those who are qualified and expertise in the "
             "sector - these are the scientists ."},
            {"risk assessment has to be undertaken by those who are qualified and expert in "
             "that area - that is the scientists ."},
            63.361730},
           {{" Die    Beziehung zwischen  Obama und Netanjahu ist nicht gerade  freundlich. "},
            {"Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."},
            64.1302698},
           {{"Niemand hat die Absicht, eine Mauer zu errichten"},
            {"Niemand hat die Absicht, eine Mauer zu errichten"},
            100.0},
       })
    EXPECT_NEAR(corpus_chrf(c.hyp, {c.ref}, o), c.want, 1e-4) << c.hyp[0];

  // test_sentence_level_chrf: beta 2 with eps_smoothing, one sentence (Czech, non-ASCII).
  o.beta = 2;
  EXPECT_NEAR(corpus_chrf({"Co nás nejvíc trápí, protože lékaři si vybírají, kdo bude žít a kdo "
                           "zemře."},
                          {{"Nejvíce smutní jsme z toho, že musíme rozhodovat o tom, kdo bude žít "
                            "a kdo zemře."}},
                          o),
              39.14078509, 1e-4);
  EXPECT_NEAR(corpus_chrf({"Nebo prostě nemají vybavení, které by jim pomohlo, uvedli lékaři."},
                          {{"A někdy nemáme ani potřebný materiál, abychom jim pomohli, popsali "
                            "lékaři."}},
                          o),
              31.22557079, 1e-4);
  EXPECT_NEAR(corpus_chrf({"Lapali po dechu, jejich životy skončily dřív, než skutečně začaly."},
                          {{"Lapali po dechu a pak jejich život skončil - dřív, než skutečně mohl "
                            "začít, připomněli."}},
                          o),
              57.15704367, 1e-4);
}

TEST(Chrf, EffectiveOrder) {
  // test_chrf.py test_cases_effective_order (sacreBLEU's default averaging, beta 3) and
  // test_cases_keep_whitespace (whitespace kept, beta 3).
  ChrfOptions o;
  o.beta = 3;
  struct Case {
    std::vector<std::string> hyp, ref;
    double want;
  };
  for (const Case& c : std::vector<Case>{{{"a"}, {"a"}, 100.0},
                                         {{""}, {"reference"}, 0.0},
                                         {{"a b c"}, {"a b c"}, 100.0},
                                         {{"a b c"}, {"abc"}, 100.0},
                                         {{""}, {"c"}, 0.0},
                                         {{"a", "b"}, {"a", "c"}, 50.0},
                                         {{"aa"}, {"ab"}, 25.0}})
    EXPECT_NEAR(corpus_chrf(c.hyp, {c.ref}, o), c.want, 1e-4) << c.hyp[0];
  o.whitespace = true;
  EXPECT_NEAR(
      corpus_chrf({"Die Beziehung zwischen Obama und Netanjahu ist nicht gerade freundlich."},
                  {{"Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade "
                    "freundschaftlich."}},
                  o),
      67.3481606, 1e-4);
  EXPECT_NEAR(corpus_chrf({"risk assessment must be made of those who are qualified and expertise "
                           "in the sector - these are the scientists ."},
                          {{"risk assessment has to be undertaken by those who are qualified and "
                            "expert in that area - that is the scientists ."}},
                          o),
              65.2414427, 1e-4);
}

TEST(Classification, MacroF1ByHand) {
  // y = [0 1 2 0 1 2], p = [0 2 1 0 0 1] (the f1_score example of scikit-learn's documentation):
  // class 0: TP 2, FP 1, FN 0 -> F1 = 4/5; classes 1 and 2: TP 0 -> F1 = 0; macro = 0.8/3.
  const ClassificationMetrics m =
      classification_metrics({0, 1, 2, 0, 1, 2}, {0, 2, 1, 0, 0, 1}, 3, 1.25);
  EXPECT_NEAR(m.macro_f1, 0.8 / 3, 1e-15);
  EXPECT_NEAR(m.accuracy, 2.0 / 6, 1e-15);
  EXPECT_EQ(m.confusion, (ConfusionMatrix{{2, 0, 0}, {1, 0, 1}, {0, 2, 0}}));
  EXPECT_EQ(m.examples, 6);
  const auto j = m.to_json();
  EXPECT_EQ(j["loss"].get<double>(), 1.25);
  EXPECT_EQ(j["confusion"][2][1].get<int64_t>(), 2);
  EXPECT_EQ(j["examples"].get<int64_t>(), 6);

  // y = [0 0 1 1 1], p = [0 1 1 1 0]: class 0 TP 1 FP 1 FN 1 -> 2/4; class 1 TP 2 FP 1 FN 1 ->
  // 4/6. A third class that occurs nowhere counts as F1 = 0 (sklearn with labels=range(3)).
  EXPECT_NEAR(macro_f1(confusion_matrix({0, 0, 1, 1, 1}, {0, 1, 1, 1, 0}, 2)), (0.5 + 4.0 / 6) / 2,
              1e-15);
  EXPECT_NEAR(macro_f1(confusion_matrix({0, 0, 1, 1, 1}, {0, 1, 1, 1, 0}, 3)), (0.5 + 4.0 / 6) / 3,
              1e-15);
  // All correct: 1.
  EXPECT_EQ(macro_f1(confusion_matrix({1, 0, 1}, {1, 0, 1}, 2)), 1.0);
  EXPECT_EQ(accuracy(confusion_matrix({}, {}, 2)), 0.0);
}

TEST(Classification, BadInput) {
  EXPECT_THROW(confusion_matrix({0, 1}, {0}, 2), Error);
  EXPECT_THROW(confusion_matrix({0, 2}, {0, 1}, 2), Error);
  EXPECT_THROW(confusion_matrix({0, 1}, {0, -1}, 2), Error);
  EXPECT_THROW(confusion_matrix({}, {}, 0), Error);
}

TEST(Classification, EnsembleOfSummedProbabilities) {
  // softmax([0, ln 3]) = [1/4, 3/4]; a large logit does not overflow.
  double p[2];
  const float logits[2] = {0.0f, std::log(3.0f)};
  softmax(logits, 2, p);
  EXPECT_NEAR(p[0], 0.25, 1e-7);
  EXPECT_NEAR(p[1], 0.75, 1e-7);
  const float big[2] = {1000.0f, 1000.0f};
  softmax(big, 2, p);
  EXPECT_EQ(p[0], 0.5);
  // Two members, two examples, two classes (summed): example 0 means [0.3, 0.7] -> class 1;
  // example 1 means [0.6, 0.4] -> class 0; a tie takes the first class.
  const ClassificationMetrics m = ensemble_metrics({1, 1}, {0.6, 1.4, 1.2, 0.8}, 2, 2);
  EXPECT_EQ(m.confusion, (ConfusionMatrix{{0, 0}, {1, 1}}));
  EXPECT_NEAR(m.loss, -(std::log(0.7) + std::log(0.4)) / 2, 1e-15);
  EXPECT_EQ(ensemble_metrics({0}, {1.0, 1.0}, 2, 2).accuracy, 1.0);
  EXPECT_THROW(ensemble_metrics({0, 1}, {1.0, 0.0}, 2, 1), Error);  // 2 examples, 1 row
  EXPECT_THROW(ensemble_metrics({2}, {1.0, 0.0}, 2, 1), Error);     // not a class
}
