#pragma once
// Pipeline schedules as explicit lists of operations per rank (inspectable, testable). The model
// is cut into pp * V chunks; chunk g runs on pipeline rank g % pp, so rank r holds the local
// chunks v = 0..V-1 with global index v * pp + r (Megatron-LM's interleaving; V = 1 otherwise).
#include <string>
#include <vector>

namespace trellis {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved };
ScheduleKind parse_schedule(const std::string& name);  // gpipe | 1f1b | interleaved
std::string schedule_name(ScheduleKind kind);

struct PipeOp {
  bool forward;
  int micro;  // micro-batch index
  int chunk;  // local chunk v
  bool operator==(const PipeOp&) const = default;
};

// Throws an input error for impossible combinations (e.g. interleaved with V < 2 or a number of
// micro-batches that is not a multiple of pp).
std::vector<PipeOp> build_schedule(ScheduleKind kind, int pp, int rank, int micro_batches,
                                   int virtual_stages);
// Forward-only schedule (evaluation): every chunk of every micro-batch in order.
std::vector<PipeOp> forward_schedule(int micro_batches, int virtual_stages);

// Blocks of each of `chunks` model chunks: balanced (earlier chunks take the remainder) or as
// given by split (one count per chunk). Input error when a chunk would have no block.
std::vector<std::vector<int>> partition_layers(int n_layer, int chunks,
                                               const std::vector<int>& split);

// Theoretical bubble fraction (p - 1) / (m + p - 1), divided by V when interleaved.
double theoretical_bubble(int pp, int micro_batches, int virtual_stages);

}  // namespace trellis
