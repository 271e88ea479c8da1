// bf16 working weights gathered from fp32 masters held in shards (parallel/working_weights.h).
#include "trellis/parallel/working_weights.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis {

namespace {
// The fp32 ranges overlapping [lo, hi), clipped to it, appended to out.
void clip(const std::vector<FlatRange>& fp32, size_t lo, size_t hi, std::vector<FlatRange>& out) {
  if (lo >= hi) return;
  auto it = std::upper_bound(fp32.begin(), fp32.end(), lo,
                             [](size_t x, const FlatRange& r) { return x < r.end; });
  for (; it != fp32.end() && it->begin < hi; ++it)
    out.push_back({std::max(lo, it->begin), std::min(hi, it->end)});
}

size_t region_end(const WorkingWeights::Region& r, int dp) {
  return r.begin + r.chunk * size_t(dp) + r.rest;
}
}  // namespace

std::vector<FlatRange> WorkingWeights::fp32_of(const std::vector<FlatRange>& fp32, const Region& r,
                                               int dp, int rank) {
  std::vector<FlatRange> out;
  const size_t lo = r.begin + r.chunk * size_t(rank);
  clip(fp32, lo, lo + r.chunk, out);
  if (size_t(rank) < r.rest) {
    const size_t e = r.begin + r.chunk * size_t(dp) + size_t(rank);
    clip(fp32, e, e + 1, out);
  }
  return out;
}

WorkingWeights::WorkingWeights(Communicator& dp, size_t padded, std::vector<FlatRange> fp32,
                               std::vector<Region> regions)
    : dp_(dp),
      dp_size_(dp.size()),
      dp_rank_(dp.rank()),
      fp32_(std::move(fp32)),
      regions_(std::move(regions)),
      bits_((padded + 1) / 2) {
  for (const Region& r : regions_) {
    std::vector<FlatRange> direct, packed;
    split(fp32_, r, dp_size_, direct, packed);
    std::vector<Direct> d;
    for (const FlatRange& f : direct) {
      Direct x{f, {}};
      for (int rank = 0; rank < dp_size_; ++rank) {
        const size_t lo = r.begin + r.chunk * size_t(rank);
        const size_t a = std::max(f.begin, lo), b = std::min(f.end, lo + r.chunk);
        x.counts.push_back(b > a ? b - a : 0);
      }
      d.push_back(std::move(x));
    }
    std::vector<size_t> counts;
    for (int rank = 0; rank < dp_size_; ++rank)
      counts.push_back(total_size(fp32_of(packed, r, dp_size_, rank)));
    direct_.push_back(std::move(d));
    packed_.push_back(std::move(packed));
    counts_.push_back(std::move(counts));
  }
}

void WorkingWeights::split(const std::vector<FlatRange>& fp32, const Region& r, int dp,
                           std::vector<FlatRange>& direct, std::vector<FlatRange>& packed) {
  const size_t main_end = r.begin + r.chunk * size_t(dp), end = main_end + r.rest;
  std::vector<FlatRange> in;
  clip(fp32, r.begin, end, in);
  for (const FlatRange& f : in) {
    const FlatRange main{f.begin, std::min(f.end, main_end)};
    if (main.begin < main.end && main.size() >= kDirect) {
      direct.push_back(main);
      if (main.end < f.end) packed.push_back({main.end, f.end});
    } else {
      packed.push_back(f);
    }
  }
}

std::unique_ptr<WorkingWeights::Gather> WorkingWeights::start(size_t i, const float* owned,
                                                              PageBuffer& params) {
  const Region& r = regions_[i];
  const size_t end = region_end(r, dp_size_);
  auto g = std::make_unique<Gather>();
  g->region = i;
  bits_.commit(r.begin / 2, (end + 1) / 2);
  std::vector<FlatRange> mine;
  clip(fp32_, r.begin, end, mine);
  for (const FlatRange& f : mine) params.commit(f.begin, f.end);
  // This rank's chunk rounded in place: the all-gather sends it from there.
  uint16_t* own = bits() + r.begin + r.chunk * size_t(dp_rank_);
  if (r.chunk > 0) {
    ops::to_bf16(own, owned, int64_t(r.chunk));
    g->main = dp_.all_gather16_async(own, bits() + r.begin, r.chunk);
  }
  if (r.rest > 0) {
    g->rest_in.assign(1, 0);
    g->rest_out.assign(size_t(dp_size_), 0);
    if (size_t(dp_rank_) < r.rest) ops::to_bf16(g->rest_in.data(), owned + r.chunk, 1);
    g->tail = dp_.all_gather16_async(g->rest_in.data(), g->rest_out.data(), 1);
  }
  // Large fp32-read tensors straight into their place, from this rank's masters of them.
  const size_t lo = r.begin + r.chunk * size_t(dp_rank_);
  for (const Direct& d : direct_[i]) {
    const size_t at = std::min(std::max(d.range.begin, lo) - lo, r.chunk);
    g->direct.push_back(dp_.all_gatherv_async(owned + at, params.data() + d.range.begin, d.counts));
  }
  // The other fp32-read elements, packed.
  const std::vector<size_t>& counts = counts_[i];
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  if (total > 0) {
    g->f32_in.assign(counts[size_t(dp_rank_)], 0.0f);
    g->f32_out.assign(total, 0.0f);
    float* at = g->f32_in.data();
    for (const FlatRange& f : fp32_of(packed_[i], r, dp_size_, dp_rank_)) {
      const size_t compact = f.begin < lo + r.chunk ? f.begin - lo : r.chunk;
      at = std::copy_n(owned + compact, f.size(), at);
    }
    g->f32 = dp_.all_gatherv_async(g->f32_in.data(), g->f32_out.data(), counts);
  }
  return g;
}

void WorkingWeights::finish(Gather& g, float* params) {
  const Region& r = regions_[g.region];
  if (g.main) g.main->wait();
  if (g.tail) {
    g.tail->wait();
    std::copy_n(g.rest_out.data(), r.rest, bits() + r.begin + r.chunk * size_t(dp_size_));
  }
  for (const std::unique_ptr<Work>& w : g.direct) w->wait();
  if (g.f32) {
    g.f32->wait();
    const float* from = g.f32_out.data();
    for (int rank = 0; rank < dp_size_; ++rank) {
      for (const FlatRange& f : fp32_of(packed_[g.region], r, dp_size_, rank)) {
        std::copy_n(from, f.size(), params + f.begin);
        from += f.size();
      }
    }
  }
}

void WorkingWeights::round_whole(size_t i, const float* params) {
  const Region& r = regions_[i];
  const size_t end = region_end(r, dp_size_);
  bits_.commit(r.begin / 2, (end + 1) / 2);
  ops::to_bf16(bits() + r.begin, params + r.begin, int64_t(end - r.begin));
}

void WorkingWeights::release(size_t i, PageBuffer& params) {
  const Region& r = regions_[i];
  const size_t end = region_end(r, dp_size_);
  // Whole floats of bits inside the region only: a neighbour's element shares the edge ones.
  bits_.release((r.begin + 1) / 2, end / 2);
  params.release(r.begin, end);
}

void WorkingWeights::release_multiplied(PageBuffer& params) const {
  size_t at = 0;
  for (const FlatRange& f : fp32_) {
    params.release(at, f.begin);
    at = f.end;
  }
  params.release(at, params.size());
}

int64_t WorkingWeights::fp32_page_bytes(const std::vector<FlatRange>& fp32, size_t begin,
                                        size_t end) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<FlatRange> in;
  clip(fp32, begin, end, in);
  int64_t pages = 0;
  bool any = false;
  size_t last = 0;  // the last page counted
  for (const FlatRange& f : in) {
    size_t first = f.begin * sizeof(float) / page;
    const size_t stop = (f.end * sizeof(float) - 1) / page;
    if (any && first <= last) first = last + 1;
    if (first <= stop) pages += int64_t(stop - first + 1);
    if (!any || stop > last) last = stop;
    any = true;
  }
  return pages * int64_t(page);
}

int64_t WorkingWeights::bits_bytes(size_t begin, size_t end, bool slack) {
  const int64_t page = int64_t(sysconf(_SC_PAGESIZE));
  const int64_t bytes = int64_t((end - begin) * sizeof(uint16_t));
  return slack ? bytes + 2 * page : (bytes + page - 1) / page * page;
}

int64_t WorkingWeights::gather_floats(const std::vector<FlatRange>& fp32, const Region& r, int dp) {
  std::vector<FlatRange> direct, packed;
  split(fp32, r, dp, direct, packed);
  size_t most = 0, total = 0;
  for (int rank = 0; rank < dp; ++rank) {
    const size_t n = total_size(fp32_of(packed, r, dp, rank));
    most = std::max(most, n);
    total += n;
  }
  return int64_t(most + total);
}

}  // namespace trellis
