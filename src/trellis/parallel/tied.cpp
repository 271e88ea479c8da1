#include "trellis/parallel/tied.h"

namespace trellis {

TiedWeights::TiedWeights(Communicator& pp_comm, const ParamLayout& layout, double timeout_s)
    : layout_(layout) {
  if (pp_comm.size() == 1) return;
  bool holds = false;
  for (const auto& s : layout.specs()) holds = holds || s.tied;
  // Stages without a tied tensor form a group of their own that is never used.
  group_ = pp_comm.split(holds ? 0 : 1, pp_comm.rank());
  group_->set_timeout(timeout_s);
  if (!holds) group_.reset();
}

void TiedWeights::reduce(float* grads) {
  if (!group_) return;
  for (const auto& s : layout_.specs())
    if (s.tied) group_->all_reduce(grads + s.offset, s.numel());
}

}  // namespace trellis
