#include "trellis/train/time_budget.h"

#include <algorithm>
#include <cmath>

namespace trellis {

int64_t budget_last_step(const BudgetClock& c, int64_t done, int64_t max_steps) {
  if (done >= max_steps) return max_steps;
  // Each step costs its own time plus its share of the periodic evaluations; the last step adds
  // the final evaluation.
  const double per_step = c.step_s + (c.val_every > 0 ? c.val_s / double(c.val_every) : 0.0);
  const double left = c.budget_s - c.elapsed_s - c.val_s;
  if (!(per_step > 0.0) || left <= per_step) return done;
  const double fit = std::floor(left / per_step);
  return fit >= double(max_steps - done) ? max_steps : done + int64_t(fit);
}

}  // namespace trellis
