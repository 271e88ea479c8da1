#pragma once
// What `trellis launch` tells the runs it starts, and the crash it can ask them to simulate.
#include <cstdint>

namespace trellis {

// Which restart of a supervised job this process belongs to: TRELLIS_RESTART (set by
// `trellis launch`), 0 outside a supervisor.
int restart_count();

// Fault injection for tests of recovery, as torchelastic's tests kill workers: with
// TRELLIS_FAULT="rank=R,step=S[,restart=K]" in the environment, rank R kills itself (SIGKILL: no
// cleanup, like a lost node) when it is about to run step S (S = 0: at start-up), in restart K
// (default 0; "any" = every restart). Malformed values are an input error naming the variable.
void fault_point(int rank, int64_t step);

}  // namespace trellis
