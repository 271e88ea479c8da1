// `trellis sample`: generate text from a checkpoint (temperature / top-k sampling).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "trellis/cli/commands.h"
#include "trellis/cli/local_model.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/core/philox.h"
#include "trellis/data/tokenizer.h"
#include "trellis/io/checkpoint.h"
#include "trellis/model/model_chunk.h"

namespace trellis {

namespace {
struct SampleArgs {
  std::string checkpoint, prompt = "\n", tokenizer_dir;
  int64_t tokens = 200;
  double temperature = 0.8;
  int top_k = 40;
  uint64_t seed = 1;
  int threads = 0;
  bool no_cache = false, timing = false;
};

// Draws from softmax(logits / temperature) restricted to the top_k largest logits.
int sample_token(std::vector<float> logits, const SampleArgs& a, uint64_t i) {
  if (a.temperature <= 0.0)
    return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t k = a.top_k > 0 ? std::min(size_t(a.top_k), idx.size()) : idx.size();
  // Ties go to the lower id, so the cached and uncached paths rank equal logits alike.
  std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(), [&](int x, int y) {
    return logits[size_t(x)] > logits[size_t(y)] ||
           (logits[size_t(x)] == logits[size_t(y)] && x < y);
  });
  const double mx = logits[size_t(idx[0])];
  std::vector<double> p(k);
  double sum = 0.0;
  for (size_t j = 0; j < k; ++j)
    sum += p[j] = std::exp((logits[size_t(idx[j])] - mx) / a.temperature);
  double u = philox_uniform(a.seed, 0x5a3b1e, i) * sum;
  for (size_t j = 0; j < k; ++j) {
    if ((u -= p[j]) <= 0.0) return idx[j];
  }
  return idx[k - 1];
}
}  // namespace

Command add_sample_command(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  CLI::App* sub = app.add_subcommand("sample", "generate text from a checkpoint");
  sub->add_option("--checkpoint", a->checkpoint, "checkpoint directory")->required();
  sub->add_option("--prompt", a->prompt, "text to continue")->capture_default_str();
  sub->add_option("--tokens", a->tokens, "tokens to generate")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "softmax temperature (0 = greedy)")
      ->capture_default_str();
  sub->add_option("--top-k", a->top_k, "sample among the k most likely tokens (0 = all)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  sub->add_option("--tokenizer-dir", a->tokenizer_dir,
                  "tokenizer directory (GPT-2's files or a tokenizer.model; default: the "
                  "checkpoint's)");
  sub->add_option("--threads", a->threads, "OpenMP threads (0 = all cores)");
  sub->add_flag("--no-cache", a->no_cache,
                "re-run the whole context for every token instead of the key/value cache (same "
                "tokens, slower; for checking)");
  sub->add_flag("--timing", a->timing,
                "print the generation's time to stderr (JSON: new tokens, seconds, tokens/s; the "
                "checkpoint's loading not included)");
  return {sub, [a](Communicator& world) {
            if (world.rank() != 0) return 0;
            if (a->threads > 0) omp_set_num_threads(a->threads);
            CheckpointData ck = load_checkpoint(a->checkpoint, false);
            auto tok = load_checkpoint_tokenizer(ck, a->tokenizer_dir);
            std::vector<int> ids = tok->encode(a->prompt);
            TRELLIS_REQUIRE(!ids.empty(), "--prompt must not be empty");
            LocalModel local(ck);
            ModelChunk& model = local.model;
            // The model conditions on at most the context length of most recent tokens. Cached,
            // it decodes one position per token until the context is full; from then on the
            // window slides, every position moves, and the cache is rebuilt from the window for
            // each token, exactly what the uncached path computes (and as slow).
            const auto t0 = std::chrono::steady_clock::now();
            const int64_t window = ck.model.block_size;
            Context ctx;
            KVCache cache;
            auto last_window = [&] {
              const size_t n = std::min(ids.size(), size_t(window));
              return std::span<const int32_t>(ids.data() + (ids.size() - n), n);
            };
            if (!a->no_cache) {
              cache = model.start_cache(1, window);
              model.decode(cache, {last_window()});
            }
            std::fputs(a->prompt.c_str(), stdout);
            DecodeStream stream(*tok, ids);
            for (int64_t i = 0; i < a->tokens; ++i) {
              std::vector<float> logits;
              if (a->no_cache) {
                const size_t T = std::min(ids.size(), size_t(window));
                model.prepare(ctx, 1, int64_t(T));
                std::copy(ids.end() - long(T), ids.end(), ctx.tokens.begin());
                logits = model.logits_at(ctx, {ctx.T - 1});
              } else {
                logits = cache.work.logits;
              }
              const int next = sample_token(std::move(logits), *a, uint64_t(i));
              ids.push_back(next);
              if (!a->no_cache && i + 1 < a->tokens) {
                if (cache.rows[0].length < window) {
                  model.decode(cache, {std::span<const int32_t>(&ids.back(), 1)});
                } else {
                  cache.clear();
                  model.decode(cache, {last_window()});
                }
              }
              const std::string piece = stream.push(next);
              std::fwrite(piece.data(), 1, piece.size(), stdout);
              std::fflush(stdout);
            }
            std::fputs((stream.finish() + "\n").c_str(), stdout);
            if (a->timing) {
              const double s =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              fmt::print(stderr,
                         "{{\"new_tokens\": {}, \"seconds\": {:.4f}, \"tokens_per_s\": {:.3f}}}\n",
                         a->tokens, s, double(a->tokens) / s);
            }
            return 0;
          }};
}

}  // namespace trellis
