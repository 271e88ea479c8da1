#pragma once
// The best validation of a run (`keep_best`) and early stopping (`early_stop_patience`).
//
// The trainer asks after each validation whether it improved the metric (strictly: ties keep the
// earlier step) and then saves OUT/best/; it stops once `patience` validations in a row brought
// none. The tracker's state travels in every checkpoint's state.json ("best"), so a resumed run
// goes on comparing with the same best and counting the same validations. Under several ranks
// the trainer hands every rank the same value (rank 0's), so they all decide alike.
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace trellis {

enum class BestMetric { None, ValLoss, ValAccuracy, ValMacroF1 };

class BestTracker {
 public:
  BestTracker() = default;
  // Input errors naming the key: an unknown metric, a classifier metric for a model that is not
  // a classifier, a negative patience or a patience without a metric, no validation data.
  BestTracker(const std::string& keep_best, int64_t patience, bool classifier, bool has_validation);

  bool enabled() const { return metric_ != BestMetric::None; }
  BestMetric metric() const { return metric_; }
  const std::string& name() const { return name_; }  // "val_loss", ...

  // A validation at `step` gave `value`: true when it improves the best (then it is the best).
  bool update(int64_t step, double value);
  // Patience is spent: as many validations in a row without improvement.
  bool should_stop() const { return patience_ > 0 && since_ >= patience_; }

  double best_value() const { return best_; }
  int64_t best_step() const { return best_step_; }  // -1 before any validation
  int64_t since() const { return since_; }          // validations since the best
  int64_t patience() const { return patience_; }

  // {"metric", "value", "step", "since"}; null when off or before any validation.
  nlohmann::json state() const;
  // Takes a checkpoint's "best" (null or another metric's: nothing to restore).
  void restore(const nlohmann::json& state);

 private:
  bool higher_is_better() const { return metric_ != BestMetric::ValLoss; }
  BestMetric metric_ = BestMetric::None;
  std::string name_;
  int64_t patience_ = 0;
  double best_ = 0.0;
  int64_t best_step_ = -1, since_ = 0;
};

}  // namespace trellis
