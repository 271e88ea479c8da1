#pragma once
// Communicators for unit tests, which have one process and no MPI:
//   FakeCommunicator: every call is a test failure (an exception) unless a test overrides it;
//   ThreadGroup:      N ranks as N threads of this process whose collectives really combine the
//                     ranks' buffers, summing in rank order (so sums are the same on every rank
//                     and in every run), and check that all ranks issue the same collectives in
//                     the same order. A wait that no other rank matches fails after a timeout.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/kernels/cpu/bf16_lanes.h"

namespace trellis::fake {

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank() const override { return rank_; }
  std::string backend() const override { return "fake"; }
  std::unique_ptr<Work> all_reduce_async(float*, size_t) override { unexpected("all_reduce"); }
  std::unique_ptr<Work> reduce_scatter_async(const float*, float*, size_t) override {
    unexpected("reduce_scatter");
  }
  std::unique_ptr<Work> all_gather_async(const float*, float*, size_t) override {
    unexpected("all_gather");
  }
  std::unique_ptr<Work> broadcast_async(float*, size_t, int) override { unexpected("broadcast"); }
  std::unique_ptr<Work> send_async(const float*, size_t, int, int) override { unexpected("send"); }
  std::unique_ptr<Work> recv_async(float*, size_t, int, int) override { unexpected("recv"); }
  void all_reduce_sum(double*, size_t) override { unexpected("all_reduce_sum"); }
  void all_reduce_max(double*, size_t) override { unexpected("all_reduce_max"); }
  void barrier() override { unexpected("barrier"); }
  std::unique_ptr<Communicator> split(int, int) override { unexpected("split"); }
  [[noreturn]] void abort(const std::string& msg, int) override { throw std::runtime_error(msg); }

 protected:
  [[noreturn]] static void unexpected(const char* op) {
    throw std::logic_error(std::string("unexpected ") + op + " on a fake communicator");
  }

 private:
  int rank_, size_;
};

class ThreadGroup {
 public:
  explicit ThreadGroup(int size, double timeout_s = 60.0) : size_(size), timeout_s_(timeout_s) {
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
  }
  int size() const { return size_; }

  // Runs body(rank's communicator) on one thread per rank and waits for all; then rethrows the
  // first rank's failure, if any.
  void run(const std::function<void(Communicator&)>& body) {
    std::vector<std::exception_ptr> failed(size_t(size_), nullptr);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] {
        try {
          body(*ranks_[size_t(r)]);
        } catch (...) {
          failed[size_t(r)] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : failed)
      if (e) std::rethrow_exception(e);
  }

 private:
  enum class Kind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    SumDoubles,
    MaxDoubles,
    Barrier
  };
  static const char* name(Kind k) {
    static const char* names[] = {"all_reduce",     "reduce_scatter", "all_gather", "broadcast",
                                  "all_reduce_sum", "all_reduce_max", "barrier"};
    return names[int(k)];
  }
  // The k-th collective of the group: every rank's input, copied when it was issued.
  struct Op {
    Kind kind;
    size_t count;
    int root = 0;
    std::vector<std::vector<float>> in;
    std::vector<std::vector<double>> in_doubles;
    int issued = 0, finished = 0;
  };

  class Rank;
  class Pending final : public Work {
   public:
    Pending(ThreadGroup& g, int rank, uint64_t seq, float* out, double* out_doubles)
        : g_(g), rank_(rank), seq_(seq), out_(out), out_doubles_(out_doubles) {}
    void wait() override {
      std::unique_lock lock(g_.m_);
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(g_.timeout_s_);
      while (!done_ && !g_.all_issued(seq_))
        if (g_.cv_.wait_until(lock, deadline) == std::cv_status::timeout && !g_.all_issued(seq_))
          throw std::runtime_error("rank " + std::to_string(rank_) + ": collective " +
                                   std::to_string(seq_) + " not issued by every rank");
      finish(lock);
    }
    bool test() override {
      std::unique_lock lock(g_.m_);
      if (!done_ && g_.all_issued(seq_)) finish(lock);
      return done_;
    }

   private:
    void finish(std::unique_lock<std::mutex>&) {
      if (done_) return;
      g_.write_result(rank_, seq_, out_, out_doubles_);
      done_ = true;
    }
    ThreadGroup& g_;
    int rank_;
    uint64_t seq_;
    float* out_;
    double* out_doubles_;
    bool done_ = false;
  };

  // Narrows float results to 16-bit elements: integers as they are, or rounded to bf16.
  class Narrowed final : public Work {
   public:
    Narrowed(std::unique_ptr<Work> w, std::unique_ptr<std::vector<float>> staging, uint16_t* out,
             bool bf16 = false)
        : w_(std::move(w)), staging_(std::move(staging)), out_(out), bf16_(bf16) {}
    void wait() override {
      w_->wait();
      narrow();
    }
    bool test() override {
      if (!w_->test()) return false;
      narrow();
      return true;
    }

   private:
    void narrow() {
      if (done_) return;
      for (size_t i = 0; i < staging_->size(); ++i)
        out_[i] = bf16_ ? simd::round_bf16((*staging_)[i]) : uint16_t((*staging_)[i]);
      done_ = true;
    }
    std::unique_ptr<Work> w_;
    std::unique_ptr<std::vector<float>> staging_;
    uint16_t* out_;
    bool bf16_;
    bool done_ = false;
  };

  class Compacted final : public Work {
   public:
    Compacted(std::unique_ptr<Work> w, std::unique_ptr<std::vector<float>> staging, float* out,
              std::vector<size_t> counts)
        : w_(std::move(w)), staging_(std::move(staging)), out_(out), counts_(std::move(counts)) {}
    void wait() override {
      w_->wait();
      compact();
    }
    bool test() override {
      if (!w_->test()) return false;
      compact();
      return true;
    }

   private:
    void compact() {
      if (done_) return;
      const size_t most = staging_->size() / counts_.size();
      float* out = out_;
      for (size_t r = 0; r < counts_.size(); ++r)
        out = std::copy_n(staging_->begin() + ptrdiff_t(r * most), counts_[r], out);
      done_ = true;
    }
    std::unique_ptr<Work> w_;
    std::unique_ptr<std::vector<float>> staging_;
    float* out_;
    std::vector<size_t> counts_;
    bool done_ = false;
  };

  class Rank final : public FakeCommunicator {
   public:
    static std::unique_ptr<std::vector<float>> widened(const uint16_t* bits, size_t n) {
      auto out = std::make_unique<std::vector<float>>(n);
      for (size_t i = 0; i < n; ++i) (*out)[i] = simd::widen_bf16(bits[i]);
      return out;
    }

    Rank(ThreadGroup& g, int rank) : FakeCommunicator(rank, g.size_), g_(g) {}
    std::string backend() const override { return "threads"; }
    std::unique_ptr<Work> all_reduce_async(float* buf, size_t n) override {
      return issue(Kind::AllReduce, n, buf, n, buf);
    }
    std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                               size_t count) override {
      return issue(Kind::ReduceScatter, count, send, count * size_t(size()), recv);
    }
    std::unique_ptr<Work> all_gather_async(const float* send, float* recv, size_t count) override {
      return issue(Kind::AllGather, count, send, count, recv);
    }
    // 16-bit elements travel as floats (exact: integers below 2^24) through a staging buffer
    // that waiting narrows into recv.
    std::unique_ptr<Work> all_gather16_async(const uint16_t* send, uint16_t* recv,
                                             size_t count) override {
      const std::vector<float> in(send, send + count);
      auto staging = std::make_unique<std::vector<float>>(count * size_t(size()));
      std::unique_ptr<Work> w = issue(Kind::AllGather, count, in.data(), count, staging->data());
      return std::make_unique<Narrowed>(std::move(w), std::move(staging), recv);
    }
    // bf16 sums travel widened (exactly) and are rounded once at the end: the values these tests
    // sum are bf16 values whose every partial sum is one too, so that is any order's result.
    std::unique_ptr<Work> all_reduce_bf16_async(uint16_t* buf, size_t n) override {
      auto staging = widened(buf, n);
      std::unique_ptr<Work> w = issue(Kind::AllReduce, n, staging->data(), n, staging->data());
      return std::make_unique<Narrowed>(std::move(w), std::move(staging), buf, true);
    }
    std::unique_ptr<Work> reduce_scatter_bf16_async(const uint16_t* send, uint16_t* recv,
                                                    size_t count) override {
      const auto in = widened(send, count * size_t(size()));
      auto staging = std::make_unique<std::vector<float>>(count);
      std::unique_ptr<Work> w =
          issue(Kind::ReduceScatter, count, in->data(), count * size_t(size()), staging->data());
      return std::make_unique<Narrowed>(std::move(w), std::move(staging), recv, true);
    }
    // Blocks padded to the largest, compacted on waiting.
    std::unique_ptr<Work> all_gatherv_async(const float* send, float* recv,
                                            const std::vector<size_t>& counts) override {
      const size_t most = *std::max_element(counts.begin(), counts.end());
      std::vector<float> in(most, 0.0f);
      std::copy_n(send, counts[size_t(rank())], in.begin());
      auto staging = std::make_unique<std::vector<float>>(most * counts.size());
      std::unique_ptr<Work> w = issue(Kind::AllGather, most, in.data(), most, staging->data());
      return std::make_unique<Compacted>(std::move(w), std::move(staging), recv, counts);
    }
    std::unique_ptr<Work> broadcast_async(float* buf, size_t n, int root) override {
      return issue(Kind::Broadcast, n, buf, n, buf, root);
    }
    void all_reduce_sum(double* buf, size_t n) override { doubles(Kind::SumDoubles, buf, n); }
    void all_reduce_max(double* buf, size_t n) override { doubles(Kind::MaxDoubles, buf, n); }
    void barrier() override { issue(Kind::Barrier, 0, nullptr, 0, nullptr)->wait(); }

   private:
    std::unique_ptr<Work> issue(Kind kind, size_t count, const float* in, size_t in_n, float* out,
                                int root = 0) {
      const uint64_t seq =
          g_.issue(rank(), next_++, kind, count, root, std::vector<float>(in, in + in_n), {});
      return std::make_unique<Pending>(g_, rank(), seq, out, nullptr);
    }
    void doubles(Kind kind, double* buf, size_t n) {
      const uint64_t seq =
          g_.issue(rank(), next_++, kind, n, 0, {}, std::vector<double>(buf, buf + n));
      Pending(g_, rank(), seq, nullptr, buf).wait();
    }
    ThreadGroup& g_;
    uint64_t next_ = 0;
  };

  uint64_t issue(int rank, uint64_t seq, Kind kind, size_t count, int root, std::vector<float> in,
                 std::vector<double> in_doubles) {
    std::lock_guard lock(m_);
    auto [it, first] = ops_.try_emplace(seq);
    Op& op = it->second;
    if (first) {
      op.kind = kind;
      op.count = count;
      op.root = root;
      op.in.resize(size_t(size_));
      op.in_doubles.resize(size_t(size_));
    } else if (op.kind != kind || op.count != count || op.root != root) {
      throw std::logic_error("rank " + std::to_string(rank) + "'s collective " +
                             std::to_string(seq) + " is " + name(kind) + " of " +
                             std::to_string(count) + ", another rank's " + name(op.kind) + " of " +
                             std::to_string(op.count));
    }
    op.in[size_t(rank)] = std::move(in);
    op.in_doubles[size_t(rank)] = std::move(in_doubles);
    if (++op.issued == size_) cv_.notify_all();
    return seq;
  }
  bool all_issued(uint64_t seq) const {
    auto it = ops_.find(seq);
    return it != ops_.end() && it->second.issued == size_;
  }
  // Called with m_ held, once per rank and collective.
  void write_result(int rank, uint64_t seq, float* out, double* out_doubles) {
    Op& op = ops_.at(seq);
    const size_t n = op.count, P = size_t(size_), r = size_t(rank);
    switch (op.kind) {
      case Kind::AllReduce:
        for (size_t i = 0; i < n; ++i) out[i] = sum(op, i);
        break;
      case Kind::ReduceScatter:
        for (size_t i = 0; i < n; ++i) out[i] = sum(op, r * n + i);
        break;
      case Kind::AllGather:
        for (size_t q = 0; q < P; ++q) std::copy_n(op.in[q].data(), n, out + q * n);
        break;
      case Kind::Broadcast:
        std::copy_n(op.in[size_t(op.root)].data(), n, out);
        break;
      case Kind::SumDoubles:
      case Kind::MaxDoubles:
        for (size_t i = 0; i < n; ++i) {
          double v = op.in_doubles[0][i];
          for (size_t q = 1; q < P; ++q)
            v = op.kind == Kind::SumDoubles ? v + op.in_doubles[q][i]
                                            : std::max(v, op.in_doubles[q][i]);
          out_doubles[i] = v;
        }
        break;
      case Kind::Barrier:
        break;
    }
    if (++op.finished == size_) ops_.erase(seq);
  }
  static float sum(const Op& op, size_t i) {
    float v = op.in[0][i];
    for (size_t q = 1; q < op.in.size(); ++q) v += op.in[q][i];
    return v;
  }

  const int size_;
  const double timeout_s_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::mutex m_;
  std::condition_variable cv_;
  std::map<uint64_t, Op> ops_;  // collectives issued by some rank and not yet finished by all
};

}  // namespace trellis::fake
