#pragma once
// What runs around each block of a model chunk from outside the model, which itself holds no
// communication: sharded data parallelism (ZeRO-3 gathers a block's parameters before it and frees
// them after; ZeRO-2/3 reduce a block's gradients once its backward is done) and the pipeline
// (it polls its sends between blocks). A model calls every installed BlockHooks, in the order
// they were installed.

namespace trellis {

// Each call gets the block's global layer index. before_forward(-1) opens a forward (before the
// embeddings; ZeRO-3 gathers its root there), before_backward(-1) a micro-batch's backward
// (before the head), after_backward(-1) closes it (after the embeddings). A hook left
// alone does nothing. A split backward (zero-bubble schedules) calls before_backward before the
// block's input-gradient part, after_input_backward after it and after_backward only once the
// weight-gradient part has written the block's gradients for this micro-batch (other blocks and
// micro-batches may run in between).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_forward(int /*layer*/) {}
  virtual void after_forward(int /*layer*/) {}
  virtual void before_backward(int /*layer*/) {}
  virtual void after_input_backward(int /*layer*/) {}
  virtual void after_backward(int /*layer*/) {}
};

}  // namespace trellis
