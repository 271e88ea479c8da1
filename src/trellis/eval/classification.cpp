#include "trellis/eval/classification.h"

#include <algorithm>
#include <cmath>

#include "trellis/core/error.h"

namespace trellis {

ConfusionMatrix confusion_matrix(const std::vector<int>& labels, const std::vector<int>& predicted,
                                 int num_classes) {
  TRELLIS_REQUIRE(num_classes >= 1, "classification needs at least one class (got {})",
                  num_classes);
  TRELLIS_REQUIRE(labels.size() == predicted.size(), "{} labels but {} predictions", labels.size(),
                  predicted.size());
  ConfusionMatrix m(size_t(num_classes), std::vector<int64_t>(size_t(num_classes), 0));
  for (size_t i = 0; i < labels.size(); ++i) {
    TRELLIS_REQUIRE(labels[i] >= 0 && labels[i] < num_classes,
                    "example {}: label {} is not a class in [0, {})", i, labels[i], num_classes);
    TRELLIS_REQUIRE(predicted[i] >= 0 && predicted[i] < num_classes,
                    "example {}: prediction {} is not a class in [0, {})", i, predicted[i],
                    num_classes);
    ++m[size_t(labels[i])][size_t(predicted[i])];
  }
  return m;
}

double accuracy(const ConfusionMatrix& m) {
  int64_t correct = 0, all = 0;
  for (size_t t = 0; t < m.size(); ++t)
    for (size_t p = 0; p < m[t].size(); ++p) {
      all += m[t][p];
      if (t == p) correct += m[t][p];
    }
  return all > 0 ? double(correct) / double(all) : 0.0;
}

double macro_f1(const ConfusionMatrix& m) {
  if (m.empty()) return 0.0;
  double sum = 0.0;
  for (size_t c = 0; c < m.size(); ++c) {
    int64_t tp = m[c][c], fp = 0, fn = 0;
    for (size_t k = 0; k < m.size(); ++k) {
      if (k == c) continue;
      fn += m[c][k];  // class c predicted as k
      fp += m[k][c];  // class k predicted as c
    }
    const int64_t denom = 2 * tp + fp + fn;
    sum += denom > 0 ? 2.0 * double(tp) / double(denom) : 0.0;
  }
  return sum / double(m.size());
}

nlohmann::json ClassificationMetrics::to_json() const {
  return {{"loss", loss},
          {"accuracy", accuracy},
          {"macro_f1", macro_f1},
          {"confusion", confusion},
          {"examples", examples}};
}

ClassificationMetrics classification_metrics(const std::vector<int>& labels,
                                             const std::vector<int>& predicted, int num_classes,
                                             double loss) {
  ClassificationMetrics r;
  r.confusion = confusion_matrix(labels, predicted, num_classes);
  r.loss = loss;
  r.accuracy = trellis::accuracy(r.confusion);
  r.macro_f1 = trellis::macro_f1(r.confusion);
  r.examples = int64_t(labels.size());
  return r;
}

void softmax(const float* logits, int64_t K, double* out) {
  const double mx = *std::max_element(logits, logits + K);
  double sum = 0.0;
  for (int64_t k = 0; k < K; ++k) sum += out[k] = std::exp(double(logits[k]) - mx);
  for (int64_t k = 0; k < K; ++k) out[k] /= sum;
}

ClassificationMetrics ensemble_metrics(const std::vector<int>& labels,
                                       const std::vector<double>& summed_probabilities,
                                       int num_classes, int members) {
  const size_t K = size_t(num_classes);
  TRELLIS_REQUIRE(summed_probabilities.size() == labels.size() * K,
                  "{} probabilities for {} examples of {} classes", summed_probabilities.size(),
                  labels.size(), K);
  std::vector<int> predicted(labels.size());
  double loss = 0.0;
  for (size_t i = 0; i < labels.size(); ++i) {
    TRELLIS_REQUIRE(labels[i] >= 0 && labels[i] < num_classes,
                    "example {}: label {} is not a class in [0, {})", i, labels[i], num_classes);
    const double* p = summed_probabilities.data() + i * K;
    predicted[i] = int(std::max_element(p, p + K) - p);
    loss -= std::log(p[size_t(labels[i])] / double(members));
  }
  return classification_metrics(labels, predicted, num_classes,
                                labels.empty() ? 0.0 : loss / double(labels.size()));
}

}  // namespace trellis
