#include "trellis/train/best.h"

#include <cmath>

#include "trellis/core/error.h"

namespace trellis {

BestTracker::BestTracker(const std::string& keep_best, int64_t patience, bool classifier,
                         bool has_validation)
    : name_(keep_best), patience_(patience) {
  if (keep_best == "val_loss")
    metric_ = BestMetric::ValLoss;
  else if (keep_best == "val_accuracy")
    metric_ = BestMetric::ValAccuracy;
  else if (keep_best == "val_macro_f1")
    metric_ = BestMetric::ValMacroF1;
  else
    TRELLIS_REQUIRE(keep_best.empty(),
                    "keep_best '{}': unknown metric (val_loss, val_accuracy or val_macro_f1; "
                    "empty = off)",
                    keep_best);
  TRELLIS_REQUIRE(metric_ == BestMetric::None || metric_ == BestMetric::ValLoss || classifier,
                  "keep_best {}: the model is not a classifier (val_accuracy and val_macro_f1 "
                  "need `task = classify`); use keep_best val_loss",
                  keep_best);
  TRELLIS_REQUIRE(patience >= 0, "early_stop_patience must be >= 0 (got {})", patience);
  TRELLIS_REQUIRE(patience == 0 || enabled(),
                  "early_stop_patience {} needs keep_best (the validation metric it watches: "
                  "val_loss, val_accuracy or val_macro_f1)",
                  patience);
  TRELLIS_REQUIRE(!enabled() || has_validation,
                  "keep_best {}: the data has no validation examples to compare", keep_best);
}

bool BestTracker::update(int64_t step, double value) {
  if (!enabled()) return false;
  // NaN never improves; the first finite (or infinite) value does.
  const bool better =
      best_step_ < 0 ? !std::isnan(value) : (higher_is_better() ? value > best_ : value < best_);
  if (better) {
    best_ = value;
    best_step_ = step;
    since_ = 0;
  } else {
    ++since_;
  }
  return better;
}

nlohmann::json BestTracker::state() const {
  if (!enabled() || (best_step_ < 0 && since_ == 0)) return nullptr;
  nlohmann::json j = {{"metric", name_}, {"step", best_step_}, {"since", since_}};
  if (best_step_ >= 0) j["value"] = best_;
  return j;
}

void BestTracker::restore(const nlohmann::json& state) {
  if (!enabled() || !state.is_object() || state.value("metric", std::string()) != name_) return;
  try {
    best_step_ = state.at("step").get<int64_t>();
    since_ = state.at("since").get<int64_t>();
    if (best_step_ >= 0) best_ = state.at("value").get<double>();
  } catch (const nlohmann::json::exception& e) {
    TRELLIS_REQUIRE(false, "a checkpoint's state.json: bad \"best\": {}", e.what());
  }
}

}  // namespace trellis
