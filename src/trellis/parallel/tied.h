#pragma once
// Tied weights across pipeline stages: the first stage owns the token embedding; a stage that also
// uses it (the last one with a tied head, an encoder-decoder's decoder start) holds a copy,
// declared by the model's parameter layout. Their gradients are summed after backward so all
// copies take the same step.
#include <memory>

#include "trellis/comm/communicator.h"
#include "trellis/model/params.h"

namespace trellis {

class TiedWeights {
 public:
  // Collective over pp_comm (every stage calls it, in the same order).
  TiedWeights(Communicator& pp_comm, const ParamLayout& layout, double timeout_s);
  // Sums the gradients of the tied tensors over the stages that hold them.
  void reduce(float* grads);

 private:
  const ParamLayout& layout_;
  std::unique_ptr<Communicator> group_;  // the stages holding a tied tensor
};

}  // namespace trellis
