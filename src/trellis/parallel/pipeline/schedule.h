#pragma once
// Pipeline schedules as explicit lists of operations per rank (inspectable, testable). The model
// is cut into pp * V chunks; chunk g runs on pipeline rank g % pp, so rank r holds the local
// chunks v = 0..V-1 with global index v * pp + r (Megatron-LM's interleaving; V = 1 otherwise).
#include <string>
#include <vector>

namespace trellis {

// ZeroBubble is ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B's order of
// forwards and backwards, each backward split into its input-gradient part (what the stage before
// waits for) and its weight-gradient part, which rank r runs r micro-batches late so that the
// input gradients travel back through the pipeline without waiting behind weight gradients.
enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubble };
ScheduleKind parse_schedule(const std::string& name);  // gpipe | 1f1b | interleaved | zb1
std::string schedule_name(ScheduleKind kind);

// What an op runs of one micro-batch on one chunk: its forward, its whole backward, or a split
// backward's two parts (Input: the input gradients, sent to the stage before; Weight: the
// weight gradients, from what Input kept). A micro-batch's activations stay alive from its
// Forward to its Backward or Weight op.
enum class Pass : unsigned char { Forward, Backward, Input, Weight };

struct PipeOp {
  Pass pass;
  int micro;  // micro-batch index
  int chunk;  // local chunk v
  bool forward() const { return pass == Pass::Forward; }
  // The op after which the micro-batch's Context is free again.
  bool ends_micro_batch() const { return pass == Pass::Backward || pass == Pass::Weight; }
  bool operator==(const PipeOp&) const = default;
};

// Whether the schedule splits backwards into Input and Weight ops.
bool splits_backward(ScheduleKind kind);

// Throws an input error for impossible combinations (e.g. interleaved with V < 2 or a number of
// micro-batches that is not a multiple of pp, zb1 with V > 1).
std::vector<PipeOp> build_schedule(ScheduleKind kind, int pp, int rank, int micro_batches,
                                   int virtual_stages);
// Forward-only schedule (evaluation): every chunk of every micro-batch in order.
std::vector<PipeOp> forward_schedule(int micro_batches, int virtual_stages);

// Blocks of each of `chunks` model chunks: balanced (earlier chunks take the remainder) or as
// given by split (one count per chunk). Input error when a chunk would have no block.
std::vector<std::vector<int>> partition_layers(int n_layer, int chunks,
                                               const std::vector<int>& split);

// Theoretical bubble fraction (p - 1) / (m + p - 1), divided by V when interleaved. zb1 with
// forward, input- and weight-gradient parts of equal time: (p - 1) / (3m + p - 1), a third of
// 1F1B's idle time (the paper's (p - 1)(T_F + T_B - T_W)).
double theoretical_bubble(int pp, int micro_batches, int virtual_stages,
                          ScheduleKind kind = ScheduleKind::OneFOneB);

}  // namespace trellis
