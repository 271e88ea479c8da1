#include "trellis/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/core/philox.h"
#include "trellis/data/sentencepiece.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

// The whole text as a number, or false.
bool parse_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(begin, i - begin));
      begin = i + 1;
    }
  return out;
}

}  // namespace

std::vector<MixtureSource> parse_data_spec(const std::string& spec) {
  const auto items = split(spec, ',');
  std::vector<MixtureSource> out;
  bool any_weight = false;
  for (const auto& item : items) {
    MixtureSource s{item, 1.0};
    const size_t colon = item.rfind(':');
    double w = 0.0;
    const bool weighted = colon != std::string::npos && parse_number(item.substr(colon + 1), w);
    if (weighted) {
      s.dir = item.substr(0, colon);
      s.weight = w;
      TRELLIS_REQUIRE(std::isfinite(w), "data mixture: {} has weight {}, not a finite number",
                      s.dir, item.substr(colon + 1));
      TRELLIS_REQUIRE(w >= 0.0, "data mixture: {} has a negative weight ({})", s.dir, w);
    }
    any_weight |= weighted;
    TRELLIS_REQUIRE(!s.dir.empty(), "data mixture '{}': an entry names no directory", spec);
    TRELLIS_REQUIRE(items.size() == 1 || weighted,
                    "data mixture '{}': {} has no weight (write DIR:WEIGHT for each dataset)", spec,
                    item);
    out.push_back(s);
  }
  double sum = 0.0;
  for (const auto& s : out) sum += s.weight;
  TRELLIS_REQUIRE(!any_weight || sum > 0.0, "data mixture '{}': the weights sum to 0", spec);
  return out;
}

int64_t Mixture::train_tokens() const {
  int64_t n = 0;
  for (const auto& c : corpora) n += c.train.size();
  return n;
}

int64_t Mixture::val_tokens() const {
  int64_t n = 0;
  for (const auto& c : corpora) n += c.val.size();
  return n;
}

Mixture load_mixture(const std::string& spec) {
  const auto sources = parse_data_spec(spec);
  Mixture m;
  for (const auto& s : sources) {
    m.corpora.push_back(load_corpus_dir(s.dir));
    m.weights.push_back(s.weight);
    std::string name = fs::path(s.dir).lexically_normal().filename().string();
    if (name.empty() || name == ".")
      name = fs::absolute(s.dir).lexically_normal().parent_path().filename().string();
    // Names key the per-dataset metrics: make repeats unique.
    const std::string base = name;
    for (int k = 2; std::find(m.names.begin(), m.names.end(), name) != m.names.end(); ++k)
      name = fmt::format("{}_{}", base, k);
    m.names.push_back(name);
  }
  const Corpus& first = m.corpora.front();
  for (size_t i = 1; i < m.corpora.size(); ++i) {
    const Corpus& c = m.corpora[i];
    TRELLIS_REQUIRE(c.tokenizer == first.tokenizer && c.vocab_size == first.vocab_size,
                    "data mixture: {} holds {} tokens (vocabulary {}) but {} holds {} tokens "
                    "(vocabulary {}); mixed datasets must share a tokenizer",
                    sources[i].dir, c.tokenizer, c.vocab_size, sources[0].dir, first.tokenizer,
                    first.vocab_size);
    // SentencePiece models of one size can still differ piece by piece.
    if (c.tokenizer == "sentencepiece") {
      const auto file = [](const Corpus& x) {
        return (fs::path(x.tokenizer_dir) / kSentencePieceFile).string();
      };
      TRELLIS_REQUIRE(read_file(file(c)) == read_file(file(first)),
                      "data mixture: {} and {} are different SentencePiece models; mixed datasets "
                      "must share a tokenizer",
                      file(c), file(first));
    }
  }
  m.tokenizer = first.tokenizer;
  m.tokenizer_dir = first.tokenizer_dir;
  m.vocab_size = first.vocab_size;
  if (m.corpora.size() == 1) {
    m.source = first.source;
  } else {
    for (size_t i = 0; i < m.corpora.size(); ++i)
      m.source +=
          fmt::format("{}{} x {}", i ? " + " : "mixture ", m.weights[i], m.corpora[i].source);
  }
  return m;
}

Mixture default_mixture() {
  Mixture m;
  m.corpora.push_back(load_default_corpus());
  m.weights = {1.0};
  m.names = {"default"};
  m.tokenizer = m.corpora[0].tokenizer;
  m.vocab_size = m.corpora[0].vocab_size;
  m.source = m.corpora[0].source;
  return m;
}

MixtureOrder::MixtureOrder(const std::vector<double>& weights, uint64_t seed) : seed_(seed) {
  TRELLIS_CHECK(!weights.empty(), "a mixture of no datasets");
  // Largest remainder: floor(K * w / sum) each, the leftover slots to the largest fractions
  // (ties to the earlier dataset).
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  TRELLIS_CHECK(sum > 0.0, "mixture weights sum to {}", sum);
  const size_t n = weights.size();
  std::vector<double> frac(n);
  quota_.assign(n, 0);
  int64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    const double exact = double(kMixBlock) * weights[i] / sum;
    quota_[i] = int64_t(std::floor(exact));
    frac[i] = exact - double(quota_[i]);
    given += quota_[i];
  }
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t(0));
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return frac[a] > frac[b]; });
  for (size_t k = 0; given < kMixBlock; ++k, ++given) ++quota_[idx[k % n]];
  // A dataset with a positive weight is sampled, however small the weight.
  for (size_t i = 0; i < n; ++i)
    if (weights[i] > 0.0 && quota_[i] == 0) {
      ++quota_[i];
      --*std::max_element(quota_.begin(), quota_.end());
    }
}

void MixtureOrder::build(int64_t block) {
  dataset_.clear();
  for (size_t d = 0; d < quota_.size(); ++d)
    dataset_.insert(dataset_.end(), size_t(quota_[d]), int32_t(d));
  if (quota_.size() > 1) {
    // Fisher-Yates keyed by (seed, block): any rank builds any block on its own.
    const uint64_t stream = 0x313e0000ull + uint64_t(block);
    for (size_t i = dataset_.size() - 1; i > 0; --i) {
      const auto k = std::min(i, size_t(philox_uniform(seed_, stream, i) * double(i + 1)));
      std::swap(dataset_[i], dataset_[k]);
    }
  }
  rank_.assign(dataset_.size(), 0);
  std::vector<int64_t> seen(quota_.size(), 0);
  for (size_t i = 0; i < dataset_.size(); ++i) rank_[i] = seen[size_t(dataset_[i])]++;
  block_ = block;
}

std::pair<int, int64_t> MixtureOrder::at(int64_t pos) {
  const int64_t block = pos / kMixBlock, slot = pos % kMixBlock;
  if (block != block_) build(block);
  const int d = dataset_[size_t(slot)];
  return {d, block * quota_[size_t(d)] + rank_[size_t(slot)]};
}

}  // namespace trellis
