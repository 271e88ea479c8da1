#include "trellis/parallel/pipeline/pipeline.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"

namespace trellis {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Pipeline::Pipeline(Communicator& pp_comm, std::vector<ModelChunk*> chunks, int64_t micro_batch,
                   int64_t seq_len, Recompute recompute, bool split_backward)
    : comm_(pp_comm),
      chunks_(std::move(chunks)),
      pp_(pp_comm.size()),
      rank_(pp_comm.rank()),
      global_chunks_(int(chunks_.size()) * pp_comm.size()),
      b_(micro_batch),
      T_(seq_len),
      recompute_(recompute),
      split_backward_(split_backward),
      pool_(chunks_.size()) {
  // A large message moves only inside MPI calls on both sides: over TCP, once the receiver's
  // handshake is back, the rest goes when the sender next enters the library. Polling only
  // between operations left a last stage's gradients unsent until its backward phase ended
  // (GPipe's bubble measured 0.5 for 0.1 in theory), so the stage also polls between blocks.
  if (pp_ == 1) return;
  for (ModelChunk* chunk : chunks_) chunk->add_block_hooks(send_polling_);
}

int64_t Pipeline::activation_bytes() const {
  int64_t n = 0;
  for (size_t v = 0; v < chunks_.size(); ++v) {
    n += chunks_[v]->workspace_bytes();
    for (const ContextSlot& s : pool_[v]) n += s.ctx->activation_bytes();
  }
  return n;
}

Context* Pipeline::acquire(int v) {
  release_finished(false);
  for (auto& s : pool_[size_t(v)])
    if (!s.busy) {
      s.busy = true;
      return s.ctx.get();
    }
  pool_[size_t(v)].push_back({std::make_unique<Context>(), true});
  Context* ctx = pool_[size_t(v)].back().ctx.get();
  ctx->recompute = recompute_;
  ctx->split_backward = split_backward_;
  chunks_[size_t(v)]->prepare(*ctx, b_, T_);
  return ctx;
}

void Pipeline::release_finished(bool wait_all) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (wait_all)
      it->work->wait();
    else if (!it->work->test()) {
      ++it;
      continue;
    }
    it = sends_.erase(it);
  }
}

// Sends a copy, so the Context goes back to the pool now: the pool then holds exactly the
// Contexts the schedule keeps alive (what plan/memory_plan predicts), however late the send ends.
void Pipeline::send_copy(const Tensor& t, int dst, int tag) {
  std::vector<float> copy(t.f32(), t.f32() + t.numel());
  std::unique_ptr<Work> work = comm_.send_async(copy.data(), copy.size(), dst, tag);
  sends_.push_back({std::move(work), std::move(copy)});
}

void Pipeline::release(int v, Context* ctx) {
  for (auto& s : pool_[size_t(v)])
    if (s.ctx.get() == ctx) s.busy = false;
}

// What one run's ops share: its arguments, the stats so far and the Contexts between a
// micro-batch's forward and its backward.
struct Pipeline::RunState {
  const Loader& load;
  float grad_scale;
  const std::function<void(int)>& on_block_done;
  const Collector& collect;
  int last_chunk;
  std::vector<size_t> last_backward;  // per local chunk: the op that completes its gradients
  PipelineStats st;
  // (chunk, micro) -> context between its Forward and its Backward (or Weight) op
  std::map<std::pair<int, int>, Context*> alive;
  int n_alive = 0;
};

namespace {
// Messages between a pair of ranks are told apart by (micro-batch, chunk, direction).
int message_tag(int micro, int g, bool fwd, int global_chunks) {
  return (micro * global_chunks + g) * 2 + fwd;
}
}  // namespace

PipelineStats Pipeline::run(const std::vector<PipeOp>& ops, const Loader& load, float grad_scale,
                            const std::function<void(int)>& on_block_done,
                            const Collector& collect) {
  const double t_start = now_s();
  if (trace_origin_ < 0) trace_origin_ = t_start;
  const int64_t micro_count =
      std::max_element(ops.begin(), ops.end(), [](auto& a, auto& b) { return a.micro < b.micro; })
          ->micro +
      1;
  TRELLIS_REQUIRE(micro_count * global_chunks_ * 2 < 32767,
                  "{} micro-batches x {} pipeline chunks is more than the message tags allow",
                  micro_count, global_chunks_);
  RunState rs{load, grad_scale, on_block_done, collect, global_chunks_ - 1,
              std::vector<size_t>(chunks_.size(), ops.size())};
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].ends_micro_batch()) rs.last_backward[size_t(ops[i].chunk)] = i;
    TRELLIS_CHECK(split_backward_ || (ops[i].pass != Pass::Input && ops[i].pass != Pass::Weight),
                  "a split-backward schedule on a pipeline built without split backwards");
  }

  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    const double t0 = now_s(), compute0 = rs.st.compute_s;
    if (op.forward())
      run_forward(op, rs);
    else if (op.pass == Pass::Weight)
      run_weights(op, i, rs);
    else
      run_backward(op, i, rs);
    if (tracing_)
      trace_.push_back({(t0 - trace_origin_) * 1e6, (now_s() - t0) * 1e6,
                        (rs.st.compute_s - compute0) * 1e6, op.micro, op.chunk * pp_ + rank_,
                        op.pass});
  }
  release_finished(true);
  rs.st.total_s = now_s() - t_start;
  return rs.st;
}

void Pipeline::run_forward(const PipeOp& op, RunState& rs) {
  const int g = op.chunk * pp_ + rank_;
  ModelChunk& model = *chunks_[size_t(op.chunk)];
  PipelineStats& st = rs.st;
  Context* ctx = acquire(op.chunk);
  st.peak_contexts = std::max(st.peak_contexts, ++rs.n_alive);
  const int64_t valid_rows = rs.load(op.micro, *ctx);
  if (g > 0)
    comm_
        .recv_async(ctx->input.f32(), size_t(ctx->input.numel()), (g - 1) % pp_,
                    message_tag(op.micro, g, true, global_chunks_))
        ->wait();
  const double tc = now_s();
  model.forward(*ctx, rs.grad_scale);
  st.compute_s += now_s() - tc;
  if (g == rs.last_chunk) {
    const int64_t n = valid_rows * T_;
    const float* losses = ctx->losses.f32();
    for (int64_t r = 0; r < n; ++r) st.loss_sum += losses[r];
    if (rs.collect) rs.collect(op.micro, *ctx, valid_rows);
  }
  // A forward without backward (evaluation) keeps nothing: its Context goes back at once.
  const bool keep = rs.grad_scale != 0.0f;
  if (g < rs.last_chunk) {
    Tensor& out = model.output(*ctx);
    const int tag = message_tag(op.micro, g + 1, true, global_chunks_);
    if (keep)
      sends_.push_back({comm_.send_async(out.f32(), size_t(out.numel()), (g + 1) % pp_, tag), {}});
    else
      send_copy(out, (g + 1) % pp_, tag);
  }
  if (keep) {
    rs.alive[{op.chunk, op.micro}] = ctx;
  } else {
    release(op.chunk, ctx);
    --rs.n_alive;
  }
}

// A Backward op, or a split backward's Input op (its Context stays for the Weight op).
void Pipeline::run_backward(const PipeOp& op, size_t i, RunState& rs) {
  const int g = op.chunk * pp_ + rank_;
  ModelChunk& model = *chunks_[size_t(op.chunk)];
  auto it = rs.alive.find({op.chunk, op.micro});
  TRELLIS_CHECK(it != rs.alive.end(), "backward of micro-batch {} before its forward", op.micro);
  Context* ctx = it->second;
  const bool whole = op.pass == Pass::Backward;
  if (whole) rs.alive.erase(it);
  release_finished(false);
  if (g < rs.last_chunk)
    comm_
        .recv_async(ctx->doutput.f32(), size_t(ctx->doutput.numel()), (g + 1) % pp_,
                    message_tag(op.micro, g, false, global_chunks_))
        ->wait();
  const double tc = now_s();
  if (whole)
    model.backward(*ctx, i == rs.last_backward[size_t(op.chunk)], rs.on_block_done);
  else
    model.backward_input(*ctx);
  rs.st.compute_s += now_s() - tc;
  if (g > 0)
    send_copy(ctx->dinput, (g - 1) % pp_, message_tag(op.micro, g - 1, false, global_chunks_));
  if (!whole) return;
  release(op.chunk, ctx);
  --rs.n_alive;
}

// A split backward's Weight op: local work only, from what its Input op kept.
void Pipeline::run_weights(const PipeOp& op, size_t i, RunState& rs) {
  auto it = rs.alive.find({op.chunk, op.micro});
  TRELLIS_CHECK(it != rs.alive.end(), "weight gradients of micro-batch {} before its forward",
                op.micro);
  Context* ctx = it->second;
  rs.alive.erase(it);
  release_finished(false);
  const double tc = now_s();
  chunks_[size_t(op.chunk)]->backward_weights(*ctx, i == rs.last_backward[size_t(op.chunk)],
                                              rs.on_block_done);
  rs.st.compute_s += now_s() - tc;
  release(op.chunk, ctx);
  --rs.n_alive;
}

}  // namespace trellis
