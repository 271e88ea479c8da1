#pragma once
// Runs a schedule on this pipeline rank: micro-batch Contexts from a pool, activations and their
// gradients exchanged with the neighbouring stages by asynchronous send/recv (bounded waits, like
// every collective), and a record of where the time went (compute vs waiting: the bubble).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trellis/model/model_chunk.h"
#include "trellis/parallel/pipeline/schedule.h"

namespace trellis {

class Communicator;

struct TraceEvent {
  double start_us, dur_us;
  double compute_us;  // of dur_us, the model's own work (the rest waited for a message)
  int micro, chunk;
  Pass pass;
};

struct PipelineStats {
  double loss_sum = 0.0;   // summed losses of valid rows (last stage only; 0 elsewhere)
  double total_s = 0.0;    // wall time of the schedule
  double compute_s = 0.0;  // forward + backward
  int peak_contexts = 0;   // micro-batch activations alive at once
};

class Pipeline {
 public:
  // chunks: this rank's model chunks by local index v (global chunk v * pp + rank). pp_comm:
  // the pipeline group (size 1 without pipeline parallelism).
  // recompute: the policy of every micro-batch Context (what its forward keeps for backward).
  // split_backward: the Contexts serve a schedule of Input and Weight ops (zb1) and keep what
  // the weight part reads.
  Pipeline(Communicator& pp_comm, std::vector<ModelChunk*> chunks, int64_t micro_batch,
           int64_t seq_len, Recompute recompute = Recompute::None, bool split_backward = false);

  // Loads micro-batch `micro` into ctx.tokens/targets; returns how many of its rows count.
  using Loader = std::function<int64_t(int micro, Context& ctx)>;
  // Sees each micro-batch's Context after the last chunk's forward (e.g. a classifier's
  // predictions), with the count of its rows that count.
  using Collector = std::function<void(int micro, const Context& ctx, int64_t rows)>;
  // Runs `ops`. grad_scale != 0 trains (backward ops present); on_block_done is passed to the
  // op that completes each chunk's gradients: its last Backward or Weight op (see
  // ModelChunk::backward and backward_weights).
  PipelineStats run(const std::vector<PipeOp>& ops, const Loader& load, float grad_scale,
                    const std::function<void(int)>& on_block_done = {},
                    const Collector& collect = {});

  void record_trace(bool on) { tracing_ = on; }
  // Activation memory of this rank: the Contexts the pool holds (as many as were ever alive at
  // once) plus each chunk's workspace (model/activation_memory predicts both).
  int64_t activation_bytes() const;
  std::vector<TraceEvent>& trace() { return trace_; }

 private:
  Context* acquire(int v);
  void release_finished(bool wait_all);
  void release(int v, Context* ctx);
  void send_copy(const Tensor& t, int dst, int tag);
  struct RunState;  // one run's bookkeeping (pipeline.cpp)
  void run_forward(const PipeOp& op, RunState& rs);
  void run_backward(const PipeOp& op, size_t i, RunState& rs);
  void run_weights(const PipeOp& op, size_t i, RunState& rs);

  Communicator& comm_;
  std::vector<ModelChunk*> chunks_;
  int pp_, rank_, global_chunks_;
  int64_t b_, T_;
  Recompute recompute_;
  bool split_backward_;
  struct ContextSlot {
    std::unique_ptr<Context> ctx;
    bool busy = false;
  };
  std::vector<std::vector<ContextSlot>> pool_;  // per local chunk
  struct PendingSend {
    std::unique_ptr<class Work> work;
    std::vector<float> copy;  // what it sends, when not a kept Context's tensor
  };
  std::vector<PendingSend> sends_;
  // Polls sends_ after each block, so they move while the next operation computes.
  class SendPolling final : public BlockHooks {
   public:
    explicit SendPolling(Pipeline& pipe) : pipe_(pipe) {}
    void after_forward(int) override { pipe_.release_finished(false); }
    void after_input_backward(int) override { pipe_.release_finished(false); }
    void after_backward(int) override { pipe_.release_finished(false); }

   private:
    Pipeline& pipe_;
  };
  SendPolling send_polling_{*this};
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  double trace_origin_ = -1.0;
};

}  // namespace trellis
