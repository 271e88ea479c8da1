// Checks the communicator on however many ranks mpirun starts (tests/parallel/test_comm_mpi.py
// runs 2, 3 and 4): every collective against values computed from the rank formula, p2p rings,
// split and mesh sub-communicators, GradReducer against a plain all-reduce, and an all-reduce and
// a message that complete while the caller makes no MPI call (the progress thread). Values are
// small integers, so sums are exact in any order and results are compared with ==; the bf16 sums
// also on values whose rounding shows.
//
//   comm_check                 all checks; exit 0 and "comm_check: ... passed" from rank 0
//   comm_check --chunk K       the same with MPI requests of at most K elements (chunked paths)
//   comm_check --no-ring       the same with MPI's own reduce-scatter in place of trellis's ring
//   comm_check --die-rank R    rank R exits(3) before a collective the others enter (5 s timeout)
//   comm_check --stall-rank R  rank R sleeps instead of joining; the others must time out (5 s)
//   comm_check --mismatch      with TRELLIS_CHECK_COLLECTIVES=1, rank r all-reduces 8 + r floats:
//                              the job must end naming both counts
//   comm_check --has-mpi       prints "mpi: yes" or "mpi: no" (was MPI support built?) and exits
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/kernels/cpu/bf16_lanes.h"
#include "trellis/parallel/data_parallel.h"
#include "trellis/parallel/mesh.h"
#ifdef TRELLIS_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C interface only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

using namespace trellis;

namespace {
int g_mpi_reduce_scatters = 0;  // calls of MPI's own reduce-scatter among 2+ ranks (below)
}  // namespace

#ifdef TRELLIS_WITH_MPI
// MPI's profiling interface: this definition takes the place of the library's for trellis's
// calls, so a run says which reduce-scatter it went through (one rank alone always uses MPI's).
extern "C" int MPI_Ireduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type,
                                         MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  if (size > 1) ++g_mpi_reduce_scatters;
  return PMPI_Ireduce_scatter_block(send, recv, count, type, op, comm, request);
}
#endif

namespace {

Communicator* g_world = nullptr;

void expect(bool ok, const std::string& what) {
  if (!ok) g_world->abort("comm_check: FAIL: " + what, 1);
}

// Element-wise comparison that names the first mismatch.
void expect_equal(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  expect(got.size() == want.size(),
         fmt::format("{}: size {} != {}", what, got.size(), want.size()));
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      expect(false, fmt::format("{}: element {} is {}, expected {}", what, i, got[i], want[i]));
}

void check_all_reduce(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const float ranks_sum = p * (p + 1) / 2.0f;  // sum of (rank + 1)
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{1000003}}) {
    std::vector<float> buf(n), want(n);
    for (size_t i = 0; i < n; ++i) {
      buf[i] = (r + 1) * float(i % 17 + 1);
      want[i] = ranks_sum * float(i % 17 + 1);
    }
    c.all_reduce(buf.data(), n);
    expect_equal(buf, want, fmt::format("all_reduce of {} floats on {}", n, c.name()));
  }
  // Several in flight at once, completed in reverse order.
  std::vector<std::vector<float>> bufs(6, std::vector<float>(5000));
  std::vector<std::unique_ptr<Work>> works;
  for (size_t k = 0; k < bufs.size(); ++k) {
    for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = float(r + k + i % 5);
    works.push_back(c.all_reduce_async(bufs[k].data(), bufs[k].size()));
  }
  for (size_t k = bufs.size(); k-- > 0;) works[k]->wait();
  for (size_t k = 0; k < bufs.size(); ++k) {
    std::vector<float> want(bufs[k].size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = float(p * (p - 1) / 2 + p * (k + i % 5));
    expect_equal(bufs[k], want, fmt::format("overlapping all_reduce #{}", k));
  }
}

void check_reduce_scatter_all_gather(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const float ranks_sum = p * (p + 1) / 2.0f;
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{250007}}) {
    std::vector<float> send(count * p), recv(count, -1.0f), want(count);
    for (int b = 0; b < p; ++b)
      for (size_t i = 0; i < count; ++i) send[b * count + i] = (r + 1) * float(b + i % 7 + 1);
    for (size_t i = 0; i < count; ++i) want[i] = ranks_sum * float(r + i % 7 + 1);
    c.reduce_scatter_async(send.data(), recv.data(), count)->wait();
    expect_equal(recv, want, fmt::format("reduce_scatter of {} floats a rank", count));

    // In place, ZeRO-style: the result lands in this rank's block of the input.
    c.reduce_scatter_async(send.data(), send.data() + r * count, count)->wait();
    expect_equal(std::vector<float>(send.begin() + r * count, send.begin() + (r + 1) * count), want,
                 fmt::format("in-place reduce_scatter of {} floats", count));

    std::vector<float> mine(count), all(count * p, -1.0f), all_want(count * p);
    for (size_t i = 0; i < count; ++i) mine[i] = float(r * 1000 + i % 13);
    for (int b = 0; b < p; ++b)
      for (size_t i = 0; i < count; ++i) all_want[b * count + i] = float(b * 1000 + i % 13);
    c.all_gather_async(mine.data(), all.data(), count)->wait();
    expect_equal(all, all_want, fmt::format("all_gather of {} floats a rank", count));

    // In place: each rank's input already sits in its block of the output.
    std::vector<float> inplace(count * p, -1.0f);
    std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
    c.all_gather_async(inplace.data() + r * count, inplace.data(), count)->wait();
    expect_equal(inplace, all_want, fmt::format("in-place all_gather of {} floats", count));
  }
}

// 16-bit all-gathers (bf16 working weights), from a separate input and in place, and all-gathers
// of uneven blocks (mixed precision's fp32-read elements), one rank's block empty.
void check_all_gather16_and_v(Communicator& c) {
  const int p = c.size(), r = c.rank();
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{250007}}) {
    std::vector<uint16_t> mine(count), all(count * p, 0xFFFF), want(count * p);
    for (size_t i = 0; i < count; ++i) mine[i] = uint16_t(r * 4099 + i * 7);
    for (int b = 0; b < p; ++b)
      for (size_t i = 0; i < count; ++i) want[b * count + i] = uint16_t(b * 4099 + i * 7);
    c.all_gather16_async(mine.data(), all.data(), count)->wait();
    expect(all == want, fmt::format("all_gather16 of {} elements a rank", count));
    std::vector<uint16_t> inplace(count * p, 0xFFFF);
    std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
    c.all_gather16_async(inplace.data() + r * count, inplace.data(), count)->wait();
    expect(inplace == want, fmt::format("in-place all_gather16 of {} elements", count));
  }
  std::vector<size_t> counts;
  for (int b = 0; b < p; ++b) counts.push_back(b == 1 ? 0 : size_t(1000 * b + 3));
  std::vector<float> mine(counts[size_t(r)]), want;
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = float(r * 100000 + int(i));
  for (int b = 0; b < p; ++b)
    for (size_t i = 0; i < counts[size_t(b)]; ++i) want.push_back(float(b * 100000 + int(i)));
  std::vector<float> all(want.size(), -1.0f);
  c.all_gatherv_async(mine.data(), all.data(), counts)->wait();
  expect_equal(all, want, "all_gatherv of uneven blocks");
}

// bf16 sums (grad_reduce_dtype = bf16). Small integers are bf16 values and so is every partial
// sum of them: exact in any order. Where sums are not bf16 values, each addition rounds once:
// with two ranks there is one order, so the result is known bit for bit; with more, every rank
// must get the same bits, within (p - 1) roundings of the exact sum (positive terms). And the
// fp32 wrappers (all_reduce_grads, reduce_scatter_grads) that write the bits over their input.
uint16_t bf(float f) { return simd::round_bf16(f); }
float wide(uint16_t b) { return simd::widen_bf16(b); }
// A positive value of no simple form, the same on every rank for (rank, i).
float ragged(int rank, size_t i) {
  const uint32_t h = uint32_t(i * 2654435761u) ^ uint32_t(rank * 40503 + 7);
  return 0.5f + float(h % 100003) / 100003.0f;
}

void check_bf16_reductions(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const float ranks_sum = p * (p + 1) / 2.0f;
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{250007}}) {
    std::vector<uint16_t> send(count * p), recv(count, 0xFFFF), want(count);
    for (int b = 0; b < p; ++b)
      for (size_t i = 0; i < count; ++i) send[b * count + i] = bf((r + 1) * float(b + i % 7 + 1));
    for (size_t i = 0; i < count; ++i) want[i] = bf(ranks_sum * float(r + i % 7 + 1));
    c.reduce_scatter_bf16_async(send.data(), recv.data(), count)->wait();
    expect(recv == want, fmt::format("bf16 reduce_scatter of {} elements a rank", count));

    std::vector<uint16_t> buf(count), all_want(count);
    for (size_t i = 0; i < count; ++i) {
      buf[i] = bf((r + 1) * float(i % 17 + 1));
      all_want[i] = bf(ranks_sum * float(i % 17 + 1));
    }
    c.all_reduce_bf16_async(buf.data(), count)->wait();
    expect(buf == all_want, fmt::format("bf16 all_reduce of {} elements", count));
  }

  const size_t n = 30011;
  std::vector<uint16_t> mine(n), sum(n), block(n);
  std::vector<uint16_t> blocks(n * p);
  for (size_t i = 0; i < n; ++i) mine[i] = sum[i] = bf(ragged(r, i));
  for (int b = 0; b < p; ++b)
    for (size_t i = 0; i < n; ++i) blocks[b * n + i] = bf(ragged(r, b * n + i));
  c.all_reduce_bf16_async(sum.data(), n)->wait();
  c.reduce_scatter_bf16_async(blocks.data(), block.data(), n)->wait();
  for (size_t i = 0; i < n; ++i) {
    double exact = 0, exact_block = 0;
    for (int q = 0; q < p; ++q) {
      exact += wide(bf(ragged(q, i)));
      exact_block += wide(bf(ragged(q, size_t(r) * n + i)));
    }
    if (p == 2) {
      const uint16_t two = bf(wide(bf(ragged(0, i))) + wide(bf(ragged(1, i))));
      const uint16_t two_block =
          bf(wide(bf(ragged(0, size_t(r) * n + i))) + wide(bf(ragged(1, size_t(r) * n + i))));
      expect(sum[i] == two && block[i] == two_block,
             fmt::format("bf16 sums of element {}: {:#06x} and {:#06x}, expected the rounded "
                         "fp32 sums {:#06x} and {:#06x}",
                         i, sum[i], block[i], two, two_block));
    }
    const double bound = (p - 1) * std::ldexp(1.0, -8);  // a rounding: half an ulp, 2^-8 of it
    expect(std::abs(wide(sum[i]) - exact) <= bound * exact &&
               std::abs(wide(block[i]) - exact_block) <= bound * exact_block,
           fmt::format("bf16 sums of element {}: {} and {}, exact {} and {}", i, wide(sum[i]),
                       wide(block[i]), exact, exact_block));
  }
  // Every rank holds the same bits of the all-reduce.
  std::vector<uint16_t> everyone(n * p);
  c.all_gather16_async(sum.data(), everyone.data(), n)->wait();
  for (int q = 0; q < p; ++q)
    expect(std::equal(sum.begin(), sum.end(), everyone.begin() + q * n),
           fmt::format("bf16 all_reduce: rank {} holds other bits than rank {}", q, r));

  // The fp32 wrappers round, reduce and widen in place.
  std::vector<float> grads(n * p), out(n, -1.0f), whole(n);
  for (size_t i = 0; i < n * p; ++i) grads[i] = ragged(r, i);
  for (size_t i = 0; i < n; ++i) whole[i] = ragged(r, i);
  reduce_scatter_grads(c, grads.data(), out.data(), n, GradReduceDtype::Bf16)->wait();
  all_reduce_grads(c, whole.data(), n, GradReduceDtype::Bf16)->wait();
  for (size_t i = 0; i < n; ++i) {
    expect(out[i] == wide(block[i]),
           fmt::format("reduce_scatter_grads(bf16) element {}: {}, expected {}", i, out[i],
                       wide(block[i])));
    expect(whole[i] == wide(sum[i]), fmt::format("all_reduce_grads(bf16) element {}: {}, "
                                                 "expected {}",
                                                 i, whole[i], wide(sum[i])));
  }
}

// Several reduce-scatters in flight, of different sizes, completed in reverse order: each must
// get its own sums, however their rounds interleave.
void check_overlapping_reduce_scatters(Communicator& c) {
  const int p = c.size(), r = c.rank();
  std::vector<std::vector<float>> send(5), recv(5);
  std::vector<std::unique_ptr<Work>> works;
  for (size_t k = 0; k < send.size(); ++k) {
    const size_t count = 1000 + 777 * k;
    send[k].resize(count * p);
    recv[k].assign(count, -1.0f);
    for (size_t i = 0; i < send[k].size(); ++i) send[k][i] = float((r + 1) * (k + 1) + i % 9);
    works.push_back(c.reduce_scatter_async(send[k].data(), recv[k].data(), count));
  }
  for (size_t k = works.size(); k-- > 0;) works[k]->wait();
  for (size_t k = 0; k < send.size(); ++k) {
    const size_t count = recv[k].size();
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i)
      want[i] = float(p * (p + 1) / 2 * (k + 1) + p * ((r * count + i) % 9));
    expect_equal(recv[k], want, fmt::format("overlapping reduce_scatter #{}", k));
  }
}

void check_broadcast(Communicator& c) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{300001}}) {
    for (int root = 0; root < c.size(); ++root) {
      std::vector<float> buf(n, -1.0f), want(n);
      for (size_t i = 0; i < n; ++i) want[i] = float(root * 7 + i % 11);
      if (c.rank() == root) buf = want;
      c.broadcast_async(buf.data(), n, root)->wait();
      expect_equal(buf, want, fmt::format("broadcast of {} floats from root {}", n, root));
    }
  }
}

void check_ring(Communicator& c) {
  const int p = c.size(), r = c.rank();
  if (p < 2) return;
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{200003}}) {
    std::vector<float> out(n), in(n, -1.0f), want(n);
    for (size_t i = 0; i < n; ++i) {
      out[i] = float(r * 100 + i % 9);
      want[i] = float(prev * 100 + i % 9);
    }
    auto rw = c.recv_async(in.data(), n, prev, 7);
    auto sw = c.send_async(out.data(), n, next, 7);
    sw->wait();
    rw->wait();
    expect_equal(in, want, fmt::format("ring of {} floats from rank {}", n, prev));
  }
  // Two messages between the same pair, told apart by tag and received in the opposite order.
  std::vector<float> a(10, float(r)), b(10, float(r + 50)), ga(10), gb(10);
  auto wb = c.recv_async(gb.data(), 10, prev, 2);
  auto wa = c.recv_async(ga.data(), 10, prev, 1);
  auto s1 = c.send_async(a.data(), 10, next, 1);
  auto s2 = c.send_async(b.data(), 10, next, 2);
  wa->wait();
  wb->wait();
  s1->wait();
  s2->wait();
  expect_equal(ga, std::vector<float>(10, float(prev)), "tagged p2p, tag 1");
  expect_equal(gb, std::vector<float>(10, float(prev + 50)), "tagged p2p, tag 2");
}

void check_doubles(Communicator& c) {
  const int p = c.size(), r = c.rank();
  double s[2] = {double(r), 0.5};
  c.all_reduce_sum(s, 2);
  expect(s[0] == p * (p - 1) / 2.0 && s[1] == 0.5 * p, "all_reduce_sum");
  double m[2] = {double(r), -double(r)};
  c.all_reduce_max(m, 2);
  expect(m[0] == p - 1 && m[1] == 0.0, "all_reduce_max");
  c.barrier();
}

void check_split(Communicator& world) {
  const int p = world.size(), r = world.rank();
  // Even and odd ranks, ordered by descending world rank.
  auto sub = world.split(r % 2, -r);
  const int members = (p - r % 2 + 1) / 2;
  expect(sub->size() == members, fmt::format("split size {} != {}", sub->size(), members));
  int above = 0;  // same-colour ranks with a larger world rank come first
  for (int q = r + 1; q < p; ++q) above += (q % 2 == r % 2);
  expect(sub->rank() == above, fmt::format("split rank {} != {}", sub->rank(), above));
  expect(sub->world_rank() == world.world_rank(), "split world_rank");
  double sum = r;
  sub->all_reduce_sum(&sum, 1);
  double want = 0;
  for (int q = r % 2; q < p; q += 2) want += q;
  expect(sum == want, fmt::format("all_reduce_sum over split: {} != {}", sum, want));
  check_all_reduce(*sub);
  check_reduce_scatter_all_gather(*sub);
  check_overlapping_reduce_scatters(*sub);
}

// For each factorisation world = dp * tp * pp: ranks, sizes and the members of each axis.
void check_meshes(Communicator& world) {
  const int p = world.size(), r = world.rank();
  for (int tp = 1; tp <= p; ++tp) {
    for (int pp = 1; tp * pp <= p; ++pp) {
      if (p % (tp * pp) != 0) continue;
      Mesh m(world, MeshShape{0, tp, pp});
      const int dp = p / (tp * pp);
      const std::string layout = fmt::format("mesh dp={} tp={} pp={}", dp, tp, pp);
      expect(m.dp() == dp && m.tp() == tp && m.pp() == pp, layout + ": shape");
      expect(r == m.pp_rank() * dp * tp + m.dp_rank() * tp + m.tp_rank(), layout + ": rank order");
      expect(m.tp_comm().size() == tp && m.tp_comm().rank() == m.tp_rank(), layout + ": tp comm");
      expect(m.dp_comm().size() == dp && m.dp_comm().rank() == m.dp_rank(), layout + ": dp comm");
      expect(m.pp_comm().size() == pp && m.pp_comm().rank() == m.pp_rank(), layout + ": pp comm");
      // Each axis reduces exactly the world ranks that differ only in that axis' coordinate.
      auto rank_of = [&](int d, int t, int q) { return q * dp * tp + d * tp + t; };
      float want_tp = 0, want_dp = 0, want_pp = 0;
      for (int t = 0; t < tp; ++t) want_tp += rank_of(m.dp_rank(), t, m.pp_rank());
      for (int d = 0; d < dp; ++d) want_dp += rank_of(d, m.tp_rank(), m.pp_rank());
      for (int q = 0; q < pp; ++q) want_pp += rank_of(m.dp_rank(), m.tp_rank(), q);
      float v = float(r);
      m.tp_comm().all_reduce(&v, 1);
      expect(v == want_tp, layout + fmt::format(": tp all_reduce {} != {}", v, want_tp));
      v = float(r);
      m.dp_comm().all_reduce(&v, 1);
      expect(v == want_dp, layout + fmt::format(": dp all_reduce {} != {}", v, want_dp));
      v = float(r);
      m.pp_comm().all_reduce(&v, 1);
      expect(v == want_pp, layout + fmt::format(": pp all_reduce {} != {}", v, want_pp));
      if (pp > 1) {  // pipeline neighbours talk over the pp communicator
        const int nxt = (m.pp_rank() + 1) % pp, prv = (m.pp_rank() + pp - 1) % pp;
        float out = float(r), in = -1;
        auto rw = m.pp_comm().recv_async(&in, 1, prv, 3);
        m.pp_comm().send_async(&out, 1, nxt, 3)->wait();
        rw->wait();
        expect(in == float(rank_of(m.dp_rank(), m.tp_rank(), prv)), layout + ": pp p2p");
      }
    }
  }
  // A layout that does not fit is an input error, raised before any communication.
  try {
    Mesh bad(world, MeshShape{p + 1, 1, 1});
    expect(false, "mesh with dp = world + 1 was accepted");
  } catch (const Error& e) {
    expect(e.kind() == ErrorKind::Input, "bad mesh is an input error");
    const std::string want = fmt::format(
        "layout dp={} x tp=1 x pp=1 = {} does not match the world size {}", p + 1, p + 1, p);
    expect(std::string(e.what()) == want, fmt::format("bad mesh message: {}", e.what()));
  }
}

// GradReducer against a plain all-reduce; in bf16 against the fp32 wrapper of the bf16 all-reduce
// (values whose sums are not bf16 values: at 2 ranks the bits are the wrapper's only if each
// bucket was rounded, reduced and widened once; beyond, within both sums' roundings).
void check_grad_reducer(Communicator& c) {
  const int r = c.rank();
  const size_t n = 1000003;
  std::vector<float> grads(n), ref(n);
  for (GradReduceDtype t : {GradReduceDtype::Fp32, GradReduceDtype::Bf16}) {
    const bool bf16 = t == GradReduceDtype::Bf16;
    // Reused across steps, as the trainer does.
    GradReducer red(c, grads.data(), n, 64 * 1024, {}, t);
    expect(red.bucket_count() == (n + 16383) / 16384,
           fmt::format("bucket count {}", red.bucket_count()));
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < n; ++i)
        grads[i] = bf16 ? ragged(r + step, i) : float((r + 1 + step) * ((i * 31) % 23));
      ref = grads;
      all_reduce_grads(c, ref.data(), n, t)->wait();
      // Backward finishes gradients from the end; announce them in uneven pieces.
      for (size_t off = n; off > 0;) {
        off = off > 77777 ? off - 77777 : 0;
        red.ready_from(off);
      }
      red.finish();
      if (!bf16 || c.size() == 2) {
        expect_equal(grads, ref,
                     fmt::format("GradReducer ({}) step {} vs all_reduce",
                                 bf16 ? "bf16" : "fp32", step));
        continue;
      }
      // More ranks: the order of the additions depends on where an element sits in its
      // collective's segments, so the bucketed sums may round elsewhere than the whole one's.
      const double bound = 2 * (c.size() - 1) * std::ldexp(1.0, -8);
      for (size_t i = 0; i < n; ++i)
        expect(std::abs(double(grads[i]) - ref[i]) <= bound * ref[i],
               fmt::format("GradReducer (bf16) step {} element {}: {}, the whole all-reduce {}",
                           step, i, grads[i], ref[i]));
    }
  }
}

// Communication progresses while the caller computes (issue 27 §2): an all-reduce and a large
// message (a pipeline send) are started, then the caller makes no MPI call at all and watches
// the buffers until they hold the results. MPI moves both only while some thread is inside it
// (the all-reduce's rounds, the message's rendezvous), so they finish only because the
// communicator's progress thread does: without it (TRELLIS_MPI_PROGRESS_US=0, or an MPI without
// MPI_THREAD_MULTIPLE) this check fails at its deadline.
void check_progress_without_calls(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const size_t n = size_t{1} << 21, m = size_t{1} << 20;  // 8 MiB and 4 MiB
  const float ranks_sum = p * (p + 1) / 2.0f;
  std::vector<float> buf(n), want(n), msg(m), got(m, 0.0f), sent(m);
  for (size_t i = 0; i < n; ++i) {
    buf[i] = (r + 1) * float(i % 17 + 1);
    want[i] = ranks_sum * float(i % 17 + 1);
  }
  for (size_t i = 0; i < m; ++i) sent[i] = float(i % 1009 + 1);
  msg = sent;
  const int last = p - 1;
  c.barrier();
  auto reduce = c.all_reduce_async(buf.data(), n);
  std::unique_ptr<Work> p2p;
  if (r == 0) p2p = c.send_async(msg.data(), m, last, 7);
  if (r == last) p2p = c.recv_async(got.data(), m, 0, 7);
  // MPI writes these buffers from the progress thread while this one reads them: atomic loads.
  const auto holds = [](std::vector<float>& v, const std::vector<float>& w) {
    for (size_t i = v.size(); i-- > 0;)
      if (std::atomic_ref<float>(v[i]).load(std::memory_order_acquire) != w[i]) return false;
    return true;
  };
  const double deadline_s = 30.0;
  const auto t0 = std::chrono::steady_clock::now();
  bool reduced = false, received = r != last;
  while (!(reduced && received)) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= deadline_s)
      expect(
          false,
          fmt::format("rank {}: {} did not complete within {:g}s while the caller made no MPI "
                      "call (is the progress thread running? TRELLIS_MPI_PROGRESS_US, "
                      "MPI_THREAD_MULTIPLE)",
                      r, reduced ? "recv of 1 Mi floats from rank 0" : "all_reduce of 2 Mi floats",
                      deadline_s));
    usleep(2000);  // compute stands in here: nothing that enters MPI
    reduced = reduced || holds(buf, want);
    received = received || holds(got, sent);
  }
  reduce->wait();
  if (p2p) p2p->wait();
  expect_equal(buf, want, "all_reduce completed by the progress thread");
  if (r == last) expect_equal(got, sent, "message received by the progress thread");
}

// Failure drills: one rank goes away; the others must not hang.
void drill(Communicator& world, int victim, bool die) {
  world.set_timeout(5.0);
  std::vector<float> buf(1000, 1.0f);
  world.all_reduce(buf.data(), buf.size());  // everyone is up
  if (world.rank() == victim) {
    if (die) {
      std::fprintf(stderr,
                   "trellis: error: rank %d: comm_check --die-rank: exiting with 3 "
                   "before all_reduce #2\n",
                   world.world_rank());
      std::fflush(stderr);
      std::exit(3);
    }
    std::fprintf(stderr, "comm_check: rank %d stalls instead of joining all_reduce #2\n",
                 world.world_rank());
    std::fflush(stderr);
    sleep(60);
    std::exit(0);
  }
  world.all_reduce(buf.data(), buf.size());
  world.abort("comm_check: all_reduce completed without the victim rank", 1);
}

}  // namespace

int main(int argc, char** argv) {
  int die_rank = -1, stall_rank = -1;
  bool no_ring = false, mismatch = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--has-mpi") {
#ifdef TRELLIS_WITH_MPI
      std::printf("mpi: yes\n");
#else
      std::printf("mpi: no\n");
#endif
      return 0;
    } else if (a == "--die-rank" && i + 1 < argc) {
      die_rank = std::atoi(argv[++i]);
    } else if (a == "--stall-rank" && i + 1 < argc) {
      stall_rank = std::atoi(argv[++i]);
    } else if (a == "--chunk" && i + 1 < argc) {
      setenv("TRELLIS_MPI_MAX_CHUNK", argv[++i], 1);
    } else if (a == "--mismatch") {
      setenv("TRELLIS_CHECK_COLLECTIVES", "1", 1);
      mismatch = true;
    } else if (a == "--no-ring") {
      setenv("TRELLIS_MPI_NO_RING", "1", 1);
      no_ring = true;
    } else {
      std::fprintf(stderr,
                   "usage: comm_check [--chunk K] [--no-ring] [--die-rank R | --stall-rank R | "
                   "--mismatch]\n");
      return 2;
    }
  }
  try {
    auto world = make_world_communicator(&argc, &argv);
    g_world = world.get();
    world->set_timeout(60.0);
    if (die_rank >= 0 || stall_rank >= 0) {
      drill(*world, die_rank >= 0 ? die_rank : stall_rank, die_rank >= 0);
    }
    const int p = world->size();
    if (mismatch) {
      // The same collectives first (the check lets them through), then counts that differ.
      check_all_reduce(*world);
      std::vector<float> buf(size_t(8 + world->rank()), 1.0f);
      world->all_reduce(buf.data(), buf.size());
      std::fprintf(stderr, "comm_check: rank %d: the mismatched all-reduce returned\n",
                   world->rank());
      return 1;
    }
    check_all_reduce(*world);
    check_reduce_scatter_all_gather(*world);
    check_all_gather16_and_v(*world);
    check_bf16_reductions(*world);
    check_overlapping_reduce_scatters(*world);
    check_broadcast(*world);
    check_ring(*world);
    check_doubles(*world);
    check_split(*world);
    check_meshes(*world);
    check_grad_reducer(*world);
    if (world->backend() == "mpi") check_progress_without_calls(*world);
    // The ring takes every reduce-scatter among 2+ ranks of a block that fits one request;
    // --no-ring hands them to MPI.
    if (world->backend() == "mpi")
      expect(no_ring ? g_mpi_reduce_scatters > 0 : g_mpi_reduce_scatters == 0,
             fmt::format("rank {}: {} calls of MPI_Ireduce_scatter_block with{} the ring",
                         world->rank(), g_mpi_reduce_scatters, no_ring ? "out" : ""));
    world->barrier();
    if (world->rank() == 0)
      std::printf("comm_check: %s backend, %d ranks: all checks passed (%s reduce-scatter)\n",
                  world->backend().c_str(), p, no_ring ? "MPI's" : "ring");
    std::fflush(stdout);
    world.reset();
    finalize_communication();
  } catch (const Error& e) {
    if (g_world) g_world->abort(fmt::format("comm_check: {}", e.what()), 1);
    std::fprintf(stderr, "trellis: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
