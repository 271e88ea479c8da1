#include "trellis/parallel/zero.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "trellis/core/clock.h"
#include "trellis/core/error.h"

namespace trellis {

DataParallelSync::DataParallelSync(Communicator& dp, int zero, const ParamLayout& layout,
                                   size_t bucket_bytes)
    : dp_(dp), zero_(zero), dp_size_(dp.size()), dp_rank_(dp.rank()), n_(layout.size()) {
  TRELLIS_REQUIRE(zero >= 0 && zero <= 3, "zero must be 0, 1, 2 or 3 (got {})", zero);
  // ZeRO-1's reduce-scatter reads a buffer padded to a multiple of dp.
  const size_t padded = shard_range(n_, dp_size_, 0).padded;
  params_ = PageBuffer(padded);
  grads_ = PageBuffer(padded);
  if (zero_ <= 1) {
    params_.commit(0, padded);
    grads_.commit(0, padded);
    shard_ = zero_ ? shard_range(n_, dp_size_, dp_rank_) : ShardRange{n_, n_, 0, n_};
    owned_ = {{shard_.begin, shard_.end}};
    if (dp_size_ > 1 && zero_ == 0)
      reducer_ = std::make_unique<GradReducer>(dp, grads_.data(), n_, bucket_bytes);
    if (zero_) staging_.assign(shard_.shard, 0.0f);
    return;
  }
  build_units(layout);
  params_.commit(0, n_);  // until adopt_params: initialisation writes the whole model
  hooks_.before_forward = [this](int l) { before_forward(l); };
  hooks_.after_forward = [this](int l) { after_forward(l); };
  hooks_.before_backward = [this](int l) { before_backward(l); };
  hooks_.after_backward = [this](int l) { after_backward(l); };
}

DataParallelSync::~DataParallelSync() = default;

std::vector<ZeroUnit> zero_units(const ParamLayout& layout) {
  std::vector<const ParamSpec*> specs;
  for (const auto& s : layout.specs()) specs.push_back(&s);
  std::sort(specs.begin(), specs.end(),
            [](const ParamSpec* a, const ParamSpec* b) { return a->offset < b->offset; });
  // Maximal runs of one block's tensors (alignment gaps included); the rest is root.
  std::vector<ZeroUnit> units;
  std::vector<char> seen;
  for (size_t i = 0; i < specs.size();) {
    const int layer = specs[i]->layer;
    size_t j = i;
    while (j < specs.size() && specs[j]->layer == layer) ++j;
    if (layer >= 0) {
      if (seen.size() <= size_t(layer)) seen.resize(size_t(layer) + 1, 0);
      TRELLIS_CHECK(!seen[size_t(layer)], "block {}'s tensors are not contiguous", layer);
      seen[size_t(layer)] = 1;
    }
    units.push_back({i == 0 ? 0 : specs[i]->offset,
                     j < specs.size() ? specs[j]->offset : layout.size(), layer});
    i = j;
  }
  return units;
}

void DataParallelSync::build_units(const ParamLayout& layout) {
  size_t at = 0;
  for (const ZeroUnit& z : zero_units(layout)) {
    if (z.layer >= 0) {
      if (unit_of_layer_.size() <= size_t(z.layer)) unit_of_layer_.resize(size_t(z.layer) + 1, -1);
      unit_of_layer_[size_t(z.layer)] = int(units_.size());
    }
    units_.push_back({z.begin, z.end, (z.end - z.begin) / size_t(dp_size_), z.layer, 0});
  }
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
  gathered_.assign(units_.size(), 1);
}

ZeroFootprint zero_footprint(const ParamLayout& layout, int dp, int dp_rank, int zero) {
  // Scratch a reduce-scatter holds per float of its output while it runs (the backend says).
  const int64_t ring_scratch = int64_t(reduce_scatter_scratch_floats(dp, 1));
  ZeroFootprint f;
  const size_t n = layout.size();
  const int64_t page = int64_t(sysconf(_SC_PAGESIZE));
  auto pages = [&](size_t floats) {
    return (int64_t(floats * sizeof(float)) + page - 1) / page * page;
  };
  if (zero <= 1) {
    const ShardRange s = zero ? shard_range(n, dp, dp_rank) : ShardRange{n, n, 0, n};
    f.params = f.grads = pages(shard_range(n, dp, 0).padded);
    f.owned = int64_t(s.end - s.begin);
    f.shards = zero ? (1 + ring_scratch) * int64_t(s.shard * sizeof(float)) : 0;
    return f;
  }
  // A unit's pages: its floats plus the partial pages at its two ends.
  int64_t root = 0, block = 0, largest_chunk = 0;
  for (const ZeroUnit& u : zero_units(layout)) {
    const size_t len = u.end - u.begin, chunk = len / size_t(dp);
    const int64_t bytes = int64_t(len * sizeof(float)) + 2 * page;
    if (u.layer < 0)
      root += bytes;
    else
      block = std::max(block, bytes);
    f.owned += int64_t(chunk + (size_t(dp_rank) < len - chunk * size_t(dp) ? 1 : 0));
    largest_chunk = std::max(largest_chunk, int64_t(chunk));
  }
  f.params = zero == 2 ? pages(n) : std::min(pages(n), root + 2 * block);
  f.grads = std::min(pages(n), root + 2 * block);
  // Compact parameters and gradients; two reductions' outputs and padded rests in flight, and
  // their ring scratch.
  f.shards = 2 * f.owned * int64_t(sizeof(float)) +
             2 * ((1 + ring_scratch) * (largest_chunk + 1) + dp) * int64_t(sizeof(float));
  return f;
}

float* DataParallelSync::owned_params() {
  return zero_ >= 2 ? owned_params_.data() : params_.data() + owned_[0].begin;
}
float* DataParallelSync::owned_grads() {
  return zero_ >= 2 ? owned_grads_.data() : grads_.data() + owned_[0].begin;
}

void DataParallelSync::ready_from(size_t offset) {
  if (reducer_) reducer_->ready_from(offset);
}

void DataParallelSync::begin_step() {
  hook_comm_s_ = 0.0;
  first_micro_ = true;
  if (zero_ <= 1) {
    std::fill_n(grads_.data(), grads_.size(), 0.0f);
    return;
  }
  // Released gradient pages read as zeros already; the shards are written by the first
  // micro-batch's reductions.
}

// ---- ZeRO-2/3: units ------------------------------------------------------------------------

std::unique_ptr<DataParallelSync::Gather> DataParallelSync::start_gather(int u) {
  const Unit& unit = units_[size_t(u)];
  auto g = std::make_unique<Gather>();
  g->unit = u;
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

void DataParallelSync::finish_gather(Gather& g) {
  const Unit& unit = units_[size_t(g.unit)];
  if (g.main) g.main->wait();
  if (g.tail) {
    g.tail->wait();
    std::copy_n(g.rest_out.data(), rest(unit), params_.data() + main_end(unit));
  }
  gathered_[size_t(g.unit)] = 1;
}

void DataParallelSync::gather_unit(int u) { finish_gather(*start_gather(u)); }

void DataParallelSync::prefetch(int u) {
  if (u < 0 || gathered_[size_t(u)] || (prefetch_ && prefetch_->unit == u)) return;
  if (prefetch_) ensure_gathered(prefetch_->unit);
  const auto t0 = Clock::now();
  prefetch_ = start_gather(u);
  hook_comm_s_ += seconds_since(t0);
}

void DataParallelSync::ensure_gathered(int u) {
  if (gathered_[size_t(u)]) return;
  const auto t0 = Clock::now();
  if (prefetch_ && prefetch_->unit == u) {
    finish_gather(*prefetch_);
    prefetch_.reset();
  } else {
    gather_unit(u);
  }
  hook_comm_s_ += seconds_since(t0);
}

void DataParallelSync::launch_reduce(int u) {
  const auto t0 = Clock::now();
  const Unit& unit = units_[size_t(u)];
  auto r = std::make_unique<Reduction>();
  r->unit = u;
  r->out.assign(unit.chunk + 1, 0.0f);
  if (unit.chunk > 0)
    r->main = dp_.reduce_scatter_async(grads_.data() + unit.begin, r->out.data(), unit.chunk);
  if (rest(unit) > 0) {
    r->rest_in.assign(size_t(dp_size_), 0.0f);
    std::copy_n(grads_.data() + main_end(unit), rest(unit), r->rest_in.data());
    r->tail = dp_.reduce_scatter_async(r->rest_in.data(), r->out.data() + unit.chunk, 1);
  }
  in_flight_.push_back(std::move(r));
  // The reduction just launched overlaps the next block's backward; the one before it must be
  // done by now (so two blocks' gradients are resident at most).
  if (in_flight_.size() > 1) finish_oldest();
  hook_comm_s_ += seconds_since(t0);
}

void DataParallelSync::finish_oldest() {
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

void DataParallelSync::finish_reductions() {
  const auto t0 = Clock::now();
  while (!in_flight_.empty()) finish_oldest();
  hook_comm_s_ += seconds_since(t0);
}

// ---- ZeRO-2/3: block hooks ------------------------------------------------------------------

int DataParallelSync::unit_of(int layer) const {
  return layer >= 0 && size_t(layer) < unit_of_layer_.size() ? unit_of_layer_[size_t(layer)] : -1;
}

void DataParallelSync::before_forward(int layer) {
  if (zero_ < 3) return;
  ensure_gathered(unit_of(layer));
  prefetch(unit_of(layer + 1));
}

void DataParallelSync::after_forward(int layer) {
  if (zero_ < 3) return;
  const int u = unit_of(layer);
  params_.release(units_[size_t(u)].begin, units_[size_t(u)].end);
  gathered_[size_t(u)] = 0;
}

void DataParallelSync::before_backward(int layer) {
  if (layer < 0) {  // the micro-batch's backward starts (with the head: root)
    for (const Unit& u : units_)
      if (u.layer < 0) grads_.commit(u.begin, u.end);
    return;
  }
  const int u = unit_of(layer);
  grads_.commit(units_[size_t(u)].begin, units_[size_t(u)].end);
  if (zero_ < 3) return;
  ensure_gathered(u);
  prefetch(unit_of(layer - 1));
}

void DataParallelSync::after_backward(int layer) {
  if (layer >= 0) {
    const int u = unit_of(layer);
    if (zero_ == 3) {
      params_.release(units_[size_t(u)].begin, units_[size_t(u)].end);
      gathered_[size_t(u)] = 0;
    }
    launch_reduce(u);
    return;
  }
  // The embeddings are done: the root's gradients are final for this micro-batch.
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer < 0) launch_reduce(int(u));
  finish_reductions();
  first_micro_ = false;
}

// ---- Step ends ------------------------------------------------------------------------------

double DataParallelSync::reduce_gradients() {
  if (reducer_) {
    reducer_->ready_from(0);  // whatever backward did not report yet
    reducer_->finish();
    return reducer_->exposed_seconds();
  }
  if (zero_ >= 2) {
    finish_reductions();
    return hook_comm_s_;
  }
  if (!zero_ || dp_size_ == 1) return 0.0;
  const auto t0 = Clock::now();
  dp_.reduce_scatter_async(grads_.data(), staging_.data(), shard_.shard)->wait();
  std::copy_n(staging_.data(), shard_.end - shard_.begin, grads_.data() + shard_.begin);
  return seconds_since(t0);
}

double DataParallelSync::gather_parameters() {
  if (!zero_ || (zero_ == 1 && dp_size_ == 1)) return 0.0;
  const auto t0 = Clock::now();
  if (zero_ == 1) {
    std::copy_n(params_.data() + shard_.begin, shard_.end - shard_.begin, staging_.data());
    dp_.all_gather_async(staging_.data(), params_.data(), shard_.shard)->wait();
  } else {
    for (size_t u = 0; u < units_.size(); ++u)
      if (zero_ == 2 || units_[u].layer < 0) gather_unit(int(u));
  }
  return seconds_since(t0);
}

void DataParallelSync::adopt_params(bool whole_buffer) {
  if (zero_ < 2) return;
  if (whole_buffer) take_owned(params_.data(), owned_params_.data());
  if (zero_ == 3)
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].layer >= 0) {
        params_.release(units_[u].begin, units_[u].end);
        gathered_[u] = 0;
      }
  if (!whole_buffer) gather_parameters();
}

void DataParallelSync::take_owned(const float* whole, float* compact) const {
  for (const FlatRange& r : owned_) {
    std::copy(whole + r.begin, whole + r.end, compact);
    compact += r.size();
  }
}

int64_t DataParallelSync::resident_bytes() const {
  return params_.committed_bytes() + grads_.committed_bytes() +
         int64_t((owned_params_.size() + owned_grads_.size() + staging_.size()) * sizeof(float));
}

}  // namespace trellis
