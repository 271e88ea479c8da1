#include "trellis/cli/ensemble.h"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>

#include "trellis/cli/local_model.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/atomic_file.h"
#include "trellis/core/clock.h"
#include "trellis/core/error.h"
#include "trellis/data/augment.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/eval/classification.h"
#include "trellis/kernels/isa.h"
#include "trellis/train/batches.h"
#include "trellis/train/config.h"
#include "trellis/train/trainer.h"

namespace trellis {

namespace fs = std::filesystem;

std::vector<std::string> expand_ensembles(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& path : paths) {
    const std::string manifest = path + "/" + kEnsembleFile;
    if (!fs::exists(manifest)) {
      out.push_back(path);
      continue;
    }
    std::ifstream in(manifest);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    TRELLIS_REQUIRE(
        j.is_object() && j.contains("members") && j["members"].is_array() && !j["members"].empty(),
        "{}: not an ensemble manifest (a JSON object whose \"members\" lists "
        "checkpoint directories)",
        manifest);
    for (const auto& m : j["members"]) {
      TRELLIS_REQUIRE(m.is_string(), "{}: \"members\" holds {}, not a directory name", manifest,
                      m.dump());
      out.push_back(path + "/" + m.get<std::string>());
    }
  }
  return out;
}

void add_class_probabilities(CheckpointData& ck, const SequenceFormat& f, const ExampleSet& set,
                             int64_t n, int64_t batch_size, DType compute, std::vector<double>& sum,
                             const std::string& tokenizer_dir, const TaskMeta* mirror) {
  const int64_t K = ck.model.num_classes;
  TRELLIS_REQUIRE(K > 0, "the checkpoint is not a classifier");
  TRELLIS_CHECK(int64_t(sum.size()) == n * K, "probabilities sized {} for {} x {}", sum.size(), n,
                K);
  LocalModel local(ck, nullptr, compute, tokenizer_dir);
  Context ctx;
  local.model.prepare(ctx, batch_size, f.T);
  std::vector<double> p(static_cast<size_t>(K));
  std::vector<uint32_t> mirrored;
  // One view of a batch (the images as stored, or mirrored) through the model, its
  // probabilities added to sum.
  const auto add_view = [&](int64_t first, int64_t rows, bool flip) {
    for (int64_t r = 0; r < batch_size; ++r) {
      const size_t i = size_t(first + r);
      if (r >= rows) {
        f.put_padding(ctx, r);
        continue;
      }
      std::span<const uint32_t> source = set.source(i);
      if (flip) {
        mirrored.resize(source.size());
        augment_image(*mirror, AugmentDraw{.flip = true}, source, mirrored);
        source = mirrored;
      }
      f.put(ctx, r, source, set.target(i), set.labels[i]);
    }
    local.model.forward(ctx, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      softmax(ctx.class_logits_or_grad.f32() + r * K, K, p.data());
      for (int64_t k = 0; k < K; ++k) sum[size_t((first + r) * K + k)] += p[size_t(k)];
    }
  };
  for (int64_t first = 0; first < n; first += batch_size) {
    const int64_t rows = std::min(batch_size, n - first);
    add_view(first, rows, false);
    if (mirror) add_view(first, rows, true);
  }
}

SequenceFormat task_format(const CheckpointData& ck, const TaskMeta& meta, const std::string& dir) {
  TRELLIS_REQUIRE(!ck.task.is_null(),
                  "{}: the checkpoint is a language model; {} holds {} examples", dir, dir,
                  meta.task);
  TRELLIS_REQUIRE(ck.task.value("task", "") == meta.task,
                  "{}: the checkpoint is a {} model, the directory holds {} examples", dir,
                  ck.task.value("task", ""), meta.task);
  TRELLIS_REQUIRE(ck.task.value("classes", std::vector<std::string>{}) == meta.classes,
                  "{}: its classes differ from the checkpoint's", dir);
  TRELLIS_REQUIRE(ck.tokenizer.kind == meta.tokenizer || meta.feature_dim > 0,
                  "{}: its texts are encoded with the {} tokenizer, the checkpoint's with {}", dir,
                  meta.tokenizer, ck.tokenizer.kind);
  if (meta.tokenizer == "sentencepiece") {
    const std::string mine =
        (std::filesystem::path(ck.tokenizer.dir) / kSentencePieceFile).string();
    const std::string theirs = (std::filesystem::path(dir) / kSentencePieceFile).string();
    TRELLIS_REQUIRE(read_file(mine) == read_file(theirs),
                    "{}: another SentencePiece model than the checkpoint's {}", theirs, mine);
  }
  TRELLIS_REQUIRE(ck.task.value("special_token", -1) == meta.special_token &&
                      ck.task.value("feature_dim", 0) == meta.feature_dim,
                  "{}: its tokens or features differ from the checkpoint's", dir);
  const int context = ck.task.value("patch_context", 0);
  TRELLIS_REQUIRE(context == 0 || meta.image_height > 0,
                  "{}: the checkpoint's patches see their neighbours (patch_context {}), and "
                  "meta.json does not record the image sizes; prepare the directory again",
                  dir, context);
  SequenceFormat f(meta, ck.task.at("seq_len").get<int64_t>(), context);
  TRELLIS_REQUIRE(ck.model.input_features == (meta.feature_dim > 0 ? f.input_features() : 0),
                  "the checkpoint's model reads {} input features a position, its task record "
                  "gives {} ({}-value patches, patch_context {})",
                  ck.model.input_features, f.input_features(), meta.feature_dim, context);
  return f;
}

ClassificationMetrics ensemble_validation(const std::vector<std::string>& members,
                                          const TaskData& d, int64_t n, int64_t batch_size,
                                          DType compute, bool tta_flip) {
  const int K = int(d.meta.classes.size());
  std::vector<double> sum(size_t(n * K), 0.0);
  for (const std::string& m : members) {
    CheckpointData ck = load_checkpoint(m, false);
    add_class_probabilities(ck, task_format(ck, d.meta, d.dir), d.val, n, batch_size, compute, sum,
                            "", tta_flip ? &d.meta : nullptr);
  }
  const std::vector<int> labels(d.val.labels.begin(), d.val.labels.begin() + n);
  return ensemble_metrics(labels, sum, K, int(members.size()) * (tta_flip ? 2 : 1));
}

namespace {

// The member's checkpoint the ensemble takes: its best with keep_best, else its last.
std::string member_checkpoint(const TrainConfig& member) {
  if (!member.keep_best.empty() && fs::exists(member.out + "/best")) return "best";
  const std::string last = find_latest_checkpoint(member.out);
  TRELLIS_CHECK(!last.empty(), "{}: the member left no checkpoint", member.out);
  return fs::path(last).filename().string();
}

// Rank 0: the ensemble's metrics on the whole validation split, written to OUT/ensemble.json.
void evaluate_ensemble(const TrainConfig& cfg, const std::vector<std::string>& members,
                       const std::vector<uint64_t>& seeds) {
  const TaskData d = load_task_data(cfg.data);
  const int64_t n = int64_t(d.val.size());
  if (n == 0) return;
  std::vector<std::string> paths;
  for (const std::string& m : members) paths.push_back(cfg.out + "/" + m);
  const ClassificationMetrics r =
      ensemble_validation(paths, d, n, cfg.batch_size, choose_precision(cfg.precision).compute);
  const nlohmann::ordered_json j = {{"members", members},         {"seeds", seeds},
                                    {"val_loss", r.loss},         {"val_accuracy", r.accuracy},
                                    {"val_macro_f1", r.macro_f1}, {"val_examples", n}};
  const std::string path = cfg.out + "/" + kEnsembleFile;
  write_file_atomic(path, j.dump(2) + "\n");
  if (!cfg.quiet)
    fmt::print(
        "trellis: ensemble of {} members: val loss {:.4f} | accuracy {:.4f} | macro-F1 {:.4f} on "
        "{} examples | {} (eval and classify take --checkpoint {})\n",
        members.size(), r.loss, r.accuracy, r.macro_f1, n, path, cfg.out);
}

}  // namespace

int train_ensemble(const TrainConfig& cfg, Communicator& world) {
  TRELLIS_REQUIRE(cfg.ensemble >= 1, "ensemble must be >= 1 (got {})", cfg.ensemble);
  if (cfg.ensemble == 1) return run_training(cfg, world);
  TRELLIS_REQUIRE(is_task_dir(cfg.data) && read_task_meta(cfg.data).task == "classify",
                  "ensemble {}: only classifiers are ensembled, and {} holds no classification "
                  "examples (trellis prepare --task classify)",
                  cfg.ensemble, cfg.data);
  TRELLIS_REQUIRE(cfg.stop_at == 0,
                  "ensemble {}: stop_at would end one member, not the ensemble (time_budget "
                  "bounds the whole run)",
                  cfg.ensemble);
  const bool lead = world.rank() == 0;
  std::vector<std::string> members;
  std::vector<uint64_t> seeds;
  double last_s = 0.0;
  for (int k = 1; k <= cfg.ensemble; ++k) {
    if (k > 1 && cfg.time_budget > 0.0) {
      // Every rank decides alike: the latest clock and the slowest member count.
      double clock[2] = {seconds_since(kProcessStart), last_s};
      world.all_reduce_max(clock, 2);
      const double left = cfg.time_budget * 60.0 - clock[0];
      if (clock[1] > left) {
        if (lead && !cfg.quiet)
          fmt::print(
              "trellis: ensemble: {} of {} members fit time_budget {:g} min (member {} "
              "took {:.0f} s, {:.0f} s are left)\n",
              k - 1, cfg.ensemble, cfg.time_budget, k - 1, clock[1], std::max(left, 0.0));
        break;
      }
    }
    TrainConfig member = cfg;
    member.seed = cfg.seed + uint64_t(k - 1);
    member.out = fmt::format("{}/member_{}", cfg.out, k);
    if (lead && !cfg.quiet)
      fmt::print("trellis: ensemble member {} of {} (seed {}): {}\n", k, cfg.ensemble, member.seed,
                 member.out);
    const Clock::time_point t0 = Clock::now();
    if (const int rc = run_training(member, world); rc != 0) return rc;
    last_s = seconds_since(t0);
    if (lead) members.push_back(fmt::format("member_{}/{}", k, member_checkpoint(member)));
    seeds.push_back(member.seed);
  }
  if (lead) evaluate_ensemble(cfg, members, seeds);
  world.barrier();
  return 0;
}

}  // namespace trellis
