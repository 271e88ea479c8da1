#pragma once
// Classification metrics over a labelled evaluation set: accuracy, macro-F1 and the confusion
// matrix, defined as scikit-learn defines them so numbers compare with the usual baselines.
#include <cstdint>
#include <vector>

#include "nlohmann/json.hpp"

namespace trellis {

// counts[t][p]: examples of true class t predicted as p.
using ConfusionMatrix = std::vector<std::vector<int64_t>>;

// Labels and predictions must be equally many and in [0, num_classes).
ConfusionMatrix confusion_matrix(const std::vector<int>& labels, const std::vector<int>& predicted,
                                 int num_classes);
// Correct / all (0 for no examples).
double accuracy(const ConfusionMatrix& m);
// The unweighted mean over all num_classes classes of F1 = 2 TP / (2 TP + FP + FN), where a class
// with TP + FP + FN = 0 (neither true nor predicted anywhere) counts as F1 = 0. This equals
// sklearn.metrics.f1_score(y, p, labels=range(num_classes), average="macro") with its default
// zero_division; called without `labels`, sklearn averages only over the classes that occur in y
// or p, which differs exactly when a class occurs in neither.
double macro_f1(const ConfusionMatrix& m);

struct ClassificationMetrics {
  double loss = 0.0;  // mean cross-entropy over the examples
  double accuracy = 0.0;
  double macro_f1 = 0.0;
  ConfusionMatrix confusion;  // [true][predicted]
  int64_t examples = 0;
  // {"loss", "accuracy", "macro_f1", "confusion", "examples"}
  nlohmann::json to_json() const;
};

// out[k] = softmax(logits)[k] for k in [0, K), computed in double.
void softmax(const float* logits, int64_t K, double* out);

// Metrics of an ensemble from its members' summed class probabilities (n x K, row-major; the mean
// is taken here): the prediction is the most probable class (the first of equals), the loss the
// mean of -log(mean probability of the true label).
ClassificationMetrics ensemble_metrics(const std::vector<int>& labels,
                                       const std::vector<double>& summed_probabilities,
                                       int num_classes, int members);

ClassificationMetrics classification_metrics(const std::vector<int>& labels,
                                             const std::vector<int>& predicted, int num_classes,
                                             double loss);

}  // namespace trellis
