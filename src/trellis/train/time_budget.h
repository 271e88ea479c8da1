#pragma once
// A run that must end within a wall-clock budget (`time_budget`, minutes).
//
// `steps` (or `epochs`) stays the most the run trains; after its first steps the trainer times
// them and cuts the run to the steps that fit the budget, evaluation included, so the learning-rate
// schedule (and warmup, when it is a share of the run) ends where the run does instead of being
// cut off at a high rate. After each further tenth of the run it is re-timed and decided again
// (a machine's speed drifts). On a faster machine the same recipe
// trains more of its steps, on a slower one fewer. The decision travels in every checkpoint's state.json ("budget_steps"), so a
// resumed run keeps it (and takes no later one) and so stays bitwise equal to one that was never
// stopped on a steady clock.
#include <cstdint>

namespace trellis {

struct BudgetClock {
  double budget_s = 0.0;   // the whole budget
  double elapsed_s = 0.0;  // since the process started
  double step_s = 0.0;     // one training step, as timed
  double val_s = 0.0;      // one evaluation of the validation split (0: none)
  int64_t val_every = 0;   // steps between evaluations (0: only at the end)
};

// The last step of a run that has finished `done` steps of at most `max_steps` and must end
// within the budget: at least `done` (end now), at most `max_steps`.
int64_t budget_last_step(const BudgetClock& c, int64_t done, int64_t max_steps);

// Steps timed before deciding: the first two warm caches and allocators and are left out.
inline constexpr int64_t kBudgetWarmSteps = 2, kBudgetTimedSteps = 20;

}  // namespace trellis
