#pragma once
// Dataset mixtures: `--data A:0.7,B:0.3` trains on windows drawn from several prepared directories
// by weight (Megatron's blended datasets). Which dataset, and which of its windows, sequence j of
// global step s reads is a pure function of (seed, s*G + j) (DESIGN invariant 2), whatever the
// layout: positions are cut into blocks of kMixBlock sequences, each block gives every dataset a
// fixed quota of slots (the weights rounded to 1/kMixBlock) in a seeded order, and a dataset's
// k-th slot reads the k-th window of its own order (data/loader's GlobalOrder, one permutation per
// epoch of that dataset). One directory is a mixture of one: exactly the unmixed run.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trellis/data/corpus.h"

namespace trellis {

constexpr int64_t kMixBlock = 4096;

struct MixtureSource {
  std::string dir;
  double weight = 1.0;
};
// "A:0.7,B:0.3" -> {{A, 0.7}, {B, 0.3}}; a plain path is one source of weight 1. A suffix after
// the last ':' that is not a number belongs to the path. Negative or non-finite weights, a
// mixture whose weights sum to zero and a mixture entry without a weight are input errors naming
// the entry.
std::vector<MixtureSource> parse_data_spec(const std::string& spec);

struct Mixture {
  std::vector<Corpus> corpora;     // one per source, in the order given
  std::vector<double> weights;     // as given (not normalised)
  std::vector<std::string> names;  // per corpus, for metrics: the directory's base name
  std::string tokenizer = "byte", tokenizer_dir;
  int vocab_size = 256;
  std::string source;  // for the log
  int64_t train_tokens() const;
  int64_t val_tokens() const;
};
// Loads every directory of the spec (load_corpus_dir); they must share tokenizer and vocabulary.
Mixture load_mixture(const std::string& spec);
// The built-in corpus as a mixture of one.
Mixture default_mixture();

// Dataset and sample index of each position of the endless sequence of training sequences.
class MixtureOrder {
 public:
  MixtureOrder(const std::vector<double>& weights, uint64_t seed);
  // (dataset, k): position pos reads the k-th sample of that dataset.
  std::pair<int, int64_t> at(int64_t pos);
  const std::vector<int64_t>& quotas() const { return quota_; }

 private:
  void build(int64_t block);
  std::vector<int64_t> quota_;  // slots per block, per dataset (sum kMixBlock)
  uint64_t seed_;
  int64_t block_ = -1;
  std::vector<int32_t> dataset_;  // per slot of the cached block
  std::vector<int64_t> rank_;     // per slot: earlier slots of the same dataset in the block
};

}  // namespace trellis
