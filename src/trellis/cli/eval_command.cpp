// `trellis eval` (mean loss of a checkpoint on fixed windows of a shard) and `trellis grad`
// (the same loss and its gradients, written as safetensors: the PyTorch oracle compares them).
#include <omp.h>

#include <nlohmann/json.hpp>

#include "trellis/cli/commands.h"
#include "trellis/core/error.h"
#include "trellis/data/loader.h"
#include "trellis/data/shard.h"
#include "trellis/io/checkpoint.h"
#include "trellis/io/safetensors.h"
#include "trellis/model/transformer.h"

namespace trellis {

namespace {

struct EvalArgs {
  std::string checkpoint, data, out;
  int64_t seq_len = 64, batch_size = 4, batches = 1;
  int threads = 0;
};

void add_eval_options(CLI::App* sub, EvalArgs& a) {
  sub->add_option("--checkpoint", a.checkpoint, "checkpoint directory (step_NNNNNNNN)")->required();
  sub->add_option("--data", a.data, "token shard (.bin, llm.c format)")->required();
  sub->add_option("--seq-len", a.seq_len, "tokens per window")->capture_default_str();
  sub->add_option("--batch-size", a.batch_size, "windows per batch")->capture_default_str();
  sub->add_option("--threads", a.threads, "OpenMP threads (0 = all cores)");
}

// Mean loss over windows [0, rows) (window i = tokens [i*T, i*T+T], targets shifted by one);
// with grads != nullptr also accumulates the gradient of that mean into grads.
double windows_loss(const EvalArgs& a, int64_t rows, bool with_grad, CheckpointData& ck,
                    std::vector<float>* grads) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  TRELLIS_REQUIRE(a.seq_len >= 1 && a.batch_size >= 1, "seq-len and batch-size must be >= 1");
  TRELLIS_REQUIRE(a.seq_len <= ck.model.block_size,
                  "seq-len {} exceeds the checkpoint's context length {}", a.seq_len,
                  ck.model.block_size);
  const std::vector<uint16_t> tokens = read_shard(a.data);
  const ParamLayout layout(ck.model);
  TensorParallel single(nullptr, false);
  Transformer model(layout, ck.params.data(), grads ? grads->data() : nullptr, single);
  Context ctx;
  model.prepare(ctx, a.batch_size, a.seq_len);
  double sum = 0.0;
  const float scale = with_grad ? 1.0f / float(rows * a.seq_len) : 0.0f;
  for (int64_t w = 0; w < rows; w += a.batch_size) {
    TRELLIS_CHECK(w + a.batch_size <= rows, "rows must be a multiple of the batch size");
    fill_eval_windows(tokens, a.seq_len, w, a.batch_size, ctx.tokens.data(), ctx.targets.data());
    sum += model.forward(ctx, scale);
    if (with_grad) model.backward(ctx, true);
  }
  return sum / double(rows * a.seq_len);
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "mean loss of a checkpoint on a token shard");
  add_eval_options(sub, *a);
  sub->add_option("--batches", a->batches, "number of batches")->capture_default_str();
  return {sub, [a](Communicator&) {
            TRELLIS_REQUIRE(a->batches >= 1, "--batches must be >= 1");
            CheckpointData ck = load_checkpoint(a->checkpoint, false);
            const int64_t rows = a->batches * a->batch_size;
            const double loss = windows_loss(*a, rows, false, ck, nullptr);
            fmt::print(
                "{}\n",
                nlohmann::json{{"loss", loss}, {"windows", rows}, {"tokens", rows * a->seq_len}}
                    .dump());
            return 0;
          }};
}

Command add_grad_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "grad", "loss and parameter gradients of one batch, as safetensors (for checking)");
  add_eval_options(sub, *a);
  sub->add_option("--out", a->out, "output .safetensors file")->required();
  return {sub, [a](Communicator&) {
            CheckpointData ck = load_checkpoint(a->checkpoint, false);
            const ParamLayout layout(ck.model);
            std::vector<float> grads(layout.size(), 0.0f);
            const double loss = windows_loss(*a, a->batch_size, true, ck, &grads);
            std::vector<TensorRef> refs;
            for (const auto& s : layout.specs()) {
              TensorRef r{s.name, s.shape, grads.data() + s.offset};
              if (s.export_rows >= 0) r.shape[0] = s.export_rows;
              refs.push_back(r);
            }
            write_safetensors(a->out, refs, {{"loss", fmt::format("{:.17g}", loss)}});
            fmt::print("{}\n", nlohmann::json{{"loss", loss}}.dump());
            return 0;
          }};
}

}  // namespace trellis
