#pragma once
// SIGTERM (a scheduler's preemption, `kill`) and SIGINT (Ctrl-C) end a training run at the next
// step boundary with a checkpoint of that step, instead of where the signal finds it: the ranks
// agree on the step (Trainer: one all-reduce of the flag a step), so every rank saves the same
// one, and `--resume` continues from it bit for bit.
namespace trellis {

// Installs the handlers (the `train` command only; the rest of trellis keeps the defaults).
void catch_stop_signals();
// The stop signal caught so far (SIGTERM or SIGINT), 0 if none.
int caught_stop_signal();

}  // namespace trellis
