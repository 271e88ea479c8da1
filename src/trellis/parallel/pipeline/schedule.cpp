#include "trellis/parallel/pipeline/schedule.h"

#include <algorithm>
#include <numeric>

#include "trellis/core/error.h"

namespace trellis {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "zb1") return ScheduleKind::ZeroBubble;
  TRELLIS_REQUIRE(false, "unknown schedule '{}' (choose gpipe, 1f1b, interleaved or zb1)", name);
  return ScheduleKind::OneFOneB;
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
    case ScheduleKind::ZeroBubble:
      return "zb1";
  }
  return "?";
}

bool splits_backward(ScheduleKind kind) { return kind == ScheduleKind::ZeroBubble; }

namespace {
// ZB-H1 on rank `rank` of pp: 1F1B's warm-up forwards, then forward / input-gradient pairs, the
// weight-gradient part of micro-batch i following the input-gradient part of micro-batch
// i + rank (the later a stage, the more input gradients it sends back before its first weight
// gradient: the last stage's run back to back). Every rank holds at most pp micro-batches
// (Forward to Weight) at once: 1F1B's peak, which rank 0 already had.
std::vector<PipeOp> zero_bubble_h1(int pp, int rank, int m) {
  std::vector<PipeOp> ops;
  const int warmup = std::min(pp - rank - 1, m);
  int next_weight = 0;
  for (int i = 0; i < warmup; ++i) ops.push_back({Pass::Forward, i, 0});
  for (int i = 0; i < m; ++i) {
    if (warmup + i < m) ops.push_back({Pass::Forward, warmup + i, 0});
    ops.push_back({Pass::Input, i, 0});
    // In the steady phase W lags by `rank`; once the forwards are done (cool-down) one W
    // follows each B, filling the wait for the next input gradient.
    if (i >= rank || warmup + i >= m) ops.push_back({Pass::Weight, next_weight++, 0});
  }
  while (next_weight < m) ops.push_back({Pass::Weight, next_weight++, 0});
  return ops;
}
}  // namespace

std::vector<PipeOp> build_schedule(ScheduleKind kind, int pp, int rank, int m, int V) {
  TRELLIS_REQUIRE(m >= 1, "a pipeline step needs at least one micro-batch");
  std::vector<PipeOp> ops;
  if (kind != ScheduleKind::Interleaved) {
    TRELLIS_REQUIRE(V == 1, "virtual_stages={} needs the interleaved schedule", V);
    if (kind == ScheduleKind::ZeroBubble) return zero_bubble_h1(pp, rank, m);
    if (kind == ScheduleKind::GPipe) {
      // All forwards, then all backwards: m micro-batches of activations alive at once.
      for (int i = 0; i < m; ++i) ops.push_back({Pass::Forward, i, 0});
      for (int i = 0; i < m; ++i) ops.push_back({Pass::Backward, i, 0});
      return ops;
    }
    // 1F1B: enough forwards to fill the pipeline below this rank, then alternate, then drain.
    // At most pp - rank micro-batches are alive on this rank.
    const int warmup = std::min(pp - rank - 1, m);
    for (int i = 0; i < warmup; ++i) ops.push_back({Pass::Forward, i, 0});
    for (int i = 0; i < m - warmup; ++i) {
      ops.push_back({Pass::Forward, warmup + i, 0});
      ops.push_back({Pass::Backward, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) ops.push_back({Pass::Backward, i, 0});
    return ops;
  }
  TRELLIS_REQUIRE(V >= 2, "the interleaved schedule needs virtual_stages >= 2 (got {})", V);
  TRELLIS_REQUIRE(pp >= 2, "the interleaved schedule needs pp >= 2");
  TRELLIS_REQUIRE(m % pp == 0,
                  "the interleaved schedule needs micro-batches ({}) to be a multiple of pp ({})",
                  m, pp);
  // Megatron-LM's interleaved 1F1B: virtual micro-step k visits chunk (k / pp) % V of micro-batch
  // (k / (pp * V)) * pp + k % pp; backwards visit the chunks in reverse.
  const int total = m * V;
  auto op = [&](int k, bool forward) {
    const int in_group = k % (pp * V);
    int chunk = in_group / pp;
    if (!forward) chunk = V - 1 - chunk;
    return PipeOp{forward ? Pass::Forward : Pass::Backward, (k / (pp * V)) * pp + k % pp, chunk};
  };
  const int warmup = std::min((pp - rank - 1) * 2 + (V - 1) * pp, total);
  for (int k = 0; k < warmup; ++k) ops.push_back(op(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(op(warmup + k, true));
    ops.push_back(op(k, false));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(op(k, false));
  return ops;
}

std::vector<PipeOp> forward_schedule(int m, int V) {
  std::vector<PipeOp> ops;
  for (int i = 0; i < m; ++i)
    for (int v = 0; v < V; ++v) ops.push_back({Pass::Forward, i, v});
  return ops;
}

std::vector<std::vector<int>> partition_layers(int n_layer, int chunks,
                                               const std::vector<int>& split) {
  std::vector<int> counts(size_t(chunks), n_layer / chunks);
  if (split.empty()) {
    TRELLIS_REQUIRE(n_layer >= chunks,
                    "{} pipeline chunks (pp x virtual_stages) need at least as many layers; the "
                    "model has {}",
                    chunks, n_layer);
    for (int c = 0; c < n_layer % chunks; ++c) ++counts[size_t(c)];
  } else {
    TRELLIS_REQUIRE(int(split.size()) == chunks,
                    "layer_split has {} entries but there are {} pipeline chunks", split.size(),
                    chunks);
    TRELLIS_REQUIRE(std::accumulate(split.begin(), split.end(), 0) == n_layer,
                    "layer_split sums to {} but the model has {} layers",
                    std::accumulate(split.begin(), split.end(), 0), n_layer);
    for (int c : split) TRELLIS_REQUIRE(c >= 1, "every layer_split entry must be >= 1");
    counts = split;
  }
  std::vector<std::vector<int>> layers(static_cast<size_t>(chunks));
  int next = 0;
  for (int c = 0; c < chunks; ++c)
    for (int i = 0; i < counts[size_t(c)]; ++i) layers[size_t(c)].push_back(next++);
  return layers;
}

double theoretical_bubble(int pp, int m, int V, ScheduleKind kind) {
  if (kind == ScheduleKind::ZeroBubble) return double(pp - 1) / double(3 * m + pp - 1);
  return double(pp - 1) / double(m + pp - 1) / double(V);
}

}  // namespace trellis
