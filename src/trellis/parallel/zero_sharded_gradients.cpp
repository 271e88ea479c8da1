// ZeRO-2: the buffer cut into units (blocks and root pieces), each split evenly over the ranks;
// a unit's gradients are reduce-scattered into this rank's compact shard as backward finishes it.
#include <unistd.h>

#include <algorithm>

#include "trellis/core/clock.h"
#include "trellis/model/model_chunk.h"
#include "trellis/parallel/zero_strategies.h"

namespace trellis {

ShardedGradientsSync::ShardedGradientsSync(Communicator& dp, const ParamLayout& layout, bool mixed,
                                           GradReduceDtype grad_dtype)
    : DataParallelSync(dp, layout, grad_dtype) {
  build_units(layout);
  if (mixed) {
    std::vector<WorkingWeights::Region> regions;
    for (const Unit& u : units_) regions.push_back({u.begin, u.chunk, rest(u)});
    make_working(layout, std::move(regions));
  }
  gathered_.assign(units_.size(), 1);
  params_.commit(0, n_);  // until adopt_params: initialisation writes the whole model
}

void ShardedGradientsSync::build_units(const ParamLayout& layout) {
  size_t at = 0;
  const std::vector<ZeroUnit> zs = zero_units(layout);
  unit_of_layer_ = unit_index_by_layer(zs);
  for (const ZeroUnit& z : zs)
    units_.push_back({z.begin, z.end, (z.end - z.begin) / size_t(dp_size_), z.layer, 0});
  for (Unit& u : units_) {
    u.owned_at = at;
    const size_t lo = u.begin + u.chunk * size_t(dp_rank_);
    if (u.chunk > 0) owned_.push_back({lo, lo + u.chunk});
    if (size_t(dp_rank_) < rest(u)) {
      const size_t r = main_end(u) + size_t(dp_rank_);
      owned_.push_back({r, r + 1});
    }
    at += owned_size(u);
  }
  if (owned_.empty()) owned_.push_back({0, 0});
  owned_params_.assign(at, 0.0f);
  owned_grads_.assign(at, 0.0f);
}

ZeroFootprint ShardedGradientsSync::footprint(const ParamLayout& layout, int dp, int dp_rank,
                                              bool mixed) {
  ZeroFootprint f;
  const size_t n = layout.size();
  int64_t largest_chunk = 0;
  for (const ZeroUnit& u : zero_units(layout)) {
    const size_t len = u.end - u.begin, chunk = len / size_t(dp);
    f.owned += int64_t(chunk + (size_t(dp_rank) < len - chunk * size_t(dp) ? 1 : 0));
    largest_chunk = std::max(largest_chunk, int64_t(chunk));
  }
  // Compact parameters and gradients. Gradient windows of the root and two blocks, the one being
  // written and the one being reduced; two reductions' outputs and padded rests in flight, and
  // their ring scratch.
  f.params = page_bytes(n);
  f.grads = f.shards = f.owned * int64_t(sizeof(float));
  f.buffers =
      gradient_window_bytes(layout, 2) +
      2 * ((1 + ring_scratch_blocks(dp)) * (largest_chunk + 1) + dp) * int64_t(sizeof(float));
  if (mixed) {
    // fp32 only where the kernels read it, bf16 bits of every unit; two units' packed gathers of
    // fp32-read elements in flight (the one waited for, the next prefetched).
    const std::vector<FlatRange> fp32 = fp32_read_ranges(layout);
    f.params = WorkingWeights::fp32_page_bytes(fp32, 0, n) + page_bytes((n + 1) / 2);
    int64_t gather = 0;
    for (const ZeroUnit& u : zero_units(layout)) {
      const size_t chunk = (u.end - u.begin) / size_t(dp);
      gather =
          std::max(gather, WorkingWeights::gather_floats(
                               fp32, {u.begin, chunk, u.end - u.begin - chunk * size_t(dp)}, dp));
    }
    f.buffers += 2 * gather * int64_t(sizeof(float));
  }
  return f;
}

int ShardedGradientsSync::unit_of(int layer) const {
  return layer >= 0 && size_t(layer) < unit_of_layer_.size() ? unit_of_layer_[size_t(layer)] : -1;
}

void ShardedGradientsSync::begin_step() {
  hook_comm_s_ = 0.0;
  // Released gradient pages read as zeros already; the shards are written by the first
  // micro-batch's reductions.
  first_micro_ = true;
}

// ---- Collectives on one unit ----------------------------------------------------------------

std::unique_ptr<ShardedGradientsSync::Gather> ShardedGradientsSync::start_gather(int u) {
  const Unit& unit = units_[size_t(u)];
  auto g = std::make_unique<Gather>();
  g->unit = u;
  if (working_) {
    g->working = working_->start(size_t(u), owned_params_.data() + unit.owned_at, params_);
    return g;
  }
  params_.commit(unit.begin, unit.end);
  if (unit.chunk > 0)
    g->main = dp_.all_gather_async(owned_params_.data() + unit.owned_at,
                                   params_.data() + unit.begin, unit.chunk);
  if (rest(unit) > 0) {
    g->rest_in.assign(1, 0.0f);
    g->rest_out.assign(size_t(dp_size_), 0.0f);
    if (size_t(dp_rank_) < rest(unit)) g->rest_in[0] = owned_params_[unit.owned_at + unit.chunk];
    g->tail = dp_.all_gather_async(g->rest_in.data(), g->rest_out.data(), 1);
  }
  return g;
}

void ShardedGradientsSync::finish_gather(Gather& g) {
  const Unit& unit = units_[size_t(g.unit)];
  if (g.working) working_->finish(*g.working, params_.data());
  if (g.main) g.main->wait();
  if (g.tail) {
    g.tail->wait();
    std::copy_n(g.rest_out.data(), rest(unit), params_.data() + main_end(unit));
  }
}

void ShardedGradientsSync::gather_unit(int u) { finish_gather(*start_gather(u)); }

void ShardedGradientsSync::ensure_gathered(int u) {
  if (u < 0 || gathered_[size_t(u)]) return;
  const auto t0 = Clock::now();
  if (prefetch_ && prefetch_->unit == u) {
    finish_gather(*prefetch_);
    prefetch_.reset();
  } else {
    gather_unit(u);
  }
  gathered_[size_t(u)] = 1;
  hook_comm_s_ += seconds_since(t0);
}

void ShardedGradientsSync::prefetch(int u) {
  if (u < 0 || gathered_[size_t(u)] || (prefetch_ && prefetch_->unit == u)) return;
  if (prefetch_) ensure_gathered(prefetch_->unit);
  const auto t0 = Clock::now();
  prefetch_ = start_gather(u);
  hook_comm_s_ += seconds_since(t0);
}

void ShardedGradientsSync::launch_reduce(int u) {
  const auto t0 = Clock::now();
  const Unit& unit = units_[size_t(u)];
  auto r = std::make_unique<Reduction>();
  r->unit = u;
  r->out.assign(unit.chunk + 1, 0.0f);
  if (unit.chunk > 0)
    r->main = reduce_scatter_grads(dp_, grads_.data() + unit.begin, r->out.data(), unit.chunk,
                                   grad_dtype_);
  if (rest(unit) > 0) {
    r->rest_in.assign(size_t(dp_size_), 0.0f);
    std::copy_n(grads_.data() + main_end(unit), rest(unit), r->rest_in.data());
    r->tail = reduce_scatter_grads(dp_, r->rest_in.data(), r->out.data() + unit.chunk, 1,
                                   grad_dtype_);
  }
  in_flight_.push_back(std::move(r));
  // The reduction just launched overlaps the next block's backward; the one before it must be
  // done by now (so two blocks' gradients are resident at most).
  if (in_flight_.size() > 1) finish_oldest();
  hook_comm_s_ += seconds_since(t0);
}

void ShardedGradientsSync::finish_oldest() {
  std::unique_ptr<Reduction> r = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  if (r->main) r->main->wait();
  if (r->tail) r->tail->wait();
  const Unit& unit = units_[size_t(r->unit)];
  float* shard = owned_grads_.data() + unit.owned_at;
  const size_t n = owned_size(unit);
  if (first_micro_)
    std::copy_n(r->out.data(), n, shard);
  else
    for (size_t i = 0; i < n; ++i) shard[i] += r->out[i];
  grads_.release(unit.begin, unit.end);
}

void ShardedGradientsSync::finish_reductions() {
  const auto t0 = Clock::now();
  while (!in_flight_.empty()) finish_oldest();
  hook_comm_s_ += seconds_since(t0);
}

// ---- Block hooks ----------------------------------------------------------------------------

void ShardedGradientsSync::before_forward(int layer) {
  if (layer < 0) return;  // the root was gathered after the update
  ensure_gathered(unit_of(layer));
  prefetch(unit_of(layer + 1));  // moves (progress thread) while this block computes
}

void ShardedGradientsSync::before_backward(int layer) {
  if (layer < 0) {  // the micro-batch's backward starts (with the head: root)
    for (const Unit& u : units_)
      if (u.layer < 0) grads_.commit(u.begin, u.end);
    return;
  }
  const Unit& u = units_[size_t(unit_of(layer))];
  grads_.commit(u.begin, u.end);
}

void ShardedGradientsSync::after_backward(int layer) {
  if (layer >= 0) {
    launch_reduce(unit_of(layer));
    return;
  }
  // The embeddings are done: the root's gradients are final for this micro-batch.
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer < 0) launch_reduce(int(u));
  finish_reductions();
  first_micro_ = false;
}

// ---- Step ends ------------------------------------------------------------------------------

double ShardedGradientsSync::reduce_gradients() {
  finish_reductions();
  return hook_comm_s_;
}

void ShardedGradientsSync::gather_root() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].layer < 0)
      gather_unit(int(u));
    else
      gathered_[u] = 0;
  }
}

double ShardedGradientsSync::gather_parameters() {
  // The root now (the embeddings run before any block hook); each block's gather waits for the
  // next forward, which runs it one block ahead, overlapped with the block before it. Nothing
  // runs ahead of the first block, so its gather starts here and moves while the next step
  // begins (its batch, the embeddings); the first block's forward waits for it.
  const auto t0 = Clock::now();
  gather_root();
  prefetch(unit_of(0));
  return seconds_since(t0);
}

void ShardedGradientsSync::adopt_params(bool whole_buffer) {
  // No gather left in flight: the trainer then checksums the whole buffer.
  if (whole_buffer) take_owned(params_.data(), owned_params_.data());
  if (working_) {
    // Every rank holds the whole initial model: its bits are rounded here, as gathers would
    // bring them; then only the fp32-read tensors keep fp32 pages.
    if (whole_buffer)
      for (size_t u = 0; u < units_.size(); ++u) working_->round_whole(u, params_.data());
    working_->release_multiplied(params_);
  }
  if (!whole_buffer) gather_root();
}

int64_t ShardedGradientsSync::resident_bytes() const {
  return DataParallelSync::resident_bytes() +
         int64_t((owned_params_.size() + owned_grads_.size()) * sizeof(float));
}

}  // namespace trellis
