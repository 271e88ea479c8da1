#include "trellis/train/batches.h"

#include <algorithm>
#include <filesystem>

#include "trellis/core/error.h"
#include "trellis/data/loader.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

class LmBatches : public Batches {
 public:
  LmBatches(const Mixture& data, int64_t T, int64_t G, uint64_t seed, bool shuffle, bool docs)
      : data_(data), T_(T), G_(G), mix_(data.weights, seed), docs_(docs) {
    for (size_t d = 0; docs && d < data.corpora.size(); ++d)
      for (const TokenStream* s : {&data.corpora[d].train, &data.corpora[d].val})
        TRELLIS_REQUIRE(s->has_doc_index(),
                        "{}: not found: document_mask needs the document index `trellis "
                        "prepare` writes beside each shard (prepare the data again)",
                        s->missing_doc_index());
    for (size_t d = 0; d < data.corpora.size(); ++d)
      // Each dataset its own permutations; dataset 0's are those of an unmixed run.
      orders_.emplace_back(window_count(data.corpora[d].train, T), G, seed, shuffle,
                           0x5eed0000ull + (uint64_t(d) << 40));
  }
  void fill(int64_t step, int64_t first, int64_t rows, Context& ctx) override {
    for (int64_t r = 0; r < rows; ++r) {
      const auto [d, k] = mix_.at(step * G_ + first + r);
      const int64_t w = orders_[size_t(d)].at(k);
      fill_window(data_.corpora[size_t(d)].train, T_, w, ctx.tokens.data() + r * T_,
                  ctx.targets.data() + r * T_);
      if (docs_) window_doc_starts(data_.corpora[size_t(d)].train, T_, w, doc_row(ctx, r));
    }
  }
  int64_t step_targets(int64_t) override { return G_ * T_; }
  int64_t val_items() const override {
    const TokenStream& val = data_.corpora[size_t(val_set_)].val;
    return val.size() > 1 ? (val.size() - 1) / T_ : 0;
  }
  void fill_val(int64_t first, int64_t rows, Context& ctx) override {
    const TokenStream& val = data_.corpora[size_t(val_set_)].val;
    fill_eval_windows(val, T_, first, rows, ctx.tokens.data(), ctx.targets.data());
    for (int64_t r = 0; docs_ && r < rows; ++r)
      window_doc_starts(val, T_, first + r, doc_row(ctx, r));
    // Padding rows copy the first one; the pipeline counts the first `rows` rows' losses only.
    for (int64_t r = rows; r < ctx.B; ++r) {
      std::copy_n(ctx.tokens.data(), T_, ctx.tokens.data() + r * T_);
      std::copy_n(ctx.targets.data(), T_, ctx.targets.data() + r * T_);
      if (docs_) std::copy_n(doc_row(ctx, 0), T_, doc_row(ctx, r));
    }
  }
  int64_t val_targets(int64_t n) override { return n * T_; }
  int val_sets() const override { return int(data_.corpora.size()); }
  std::string val_set_name(int i) const override { return data_.names[size_t(i)]; }
  void select_val(int i) override { val_set_ = i; }

 private:
  // Row r of ctx.doc_start (sized to the Context's B*T on first use).
  int32_t* doc_row(Context& ctx, int64_t r) const {
    if (ctx.doc_start.size() != size_t(ctx.B * ctx.T)) ctx.doc_start.assign(size_t(ctx.B * ctx.T), 0);
    return ctx.doc_start.data() + r * T_;
  }
  const Mixture& data_;
  int64_t T_, G_;
  MixtureOrder mix_;
  bool docs_;
  std::vector<GlobalOrder> orders_;
  int val_set_ = 0;
};

class TaskBatches : public Batches {
 public:
  TaskBatches(const TaskData& d, int64_t T, int64_t G, uint64_t seed, bool shuffle,
              const Augment& augment, int patch_context)
      : d_(d),
        format_(d.meta, T, patch_context),
        G_(G),
        seed_(seed),
        order_(int64_t(d.train.size()), G, seed, shuffle),
        augment_(augment) {}
  void fill(int64_t step, int64_t first, int64_t rows, Context& ctx) override {
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = size_t(order_.item(step, first + r));
      std::span<const uint32_t> source = d_.train.source(i);
      if (augment_.any()) {
        const int64_t epoch = (step * G_ + first + r) / order_.items();
        scratch_.resize(source.size());
        augment_image(d_.meta, augment_draw(augment_, seed_, epoch, int64_t(i)), source, scratch_);
        source = scratch_;
      }
      format_.put(ctx, r, source, d_.train.target(i), d_.train.labels[i]);
    }
  }
  int64_t step_targets(int64_t step) override {
    int64_t n = 0;
    for (int64_t j = 0; j < G_; ++j)
      n += format_.targets(d_.train.target(size_t(order_.item(step, j))));
    return n;
  }
  int64_t val_items() const override { return int64_t(d_.val.size()); }
  void fill_val(int64_t first, int64_t rows, Context& ctx) override {
    for (int64_t r = 0; r < ctx.B; ++r) {
      const size_t i = size_t(first + r);
      if (r < rows)
        format_.put(ctx, r, d_.val.source(i), d_.val.target(i), d_.val.labels[i]);
      else
        format_.put_padding(ctx, r);
    }
  }
  int64_t val_targets(int64_t n) override {
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += format_.targets(d_.val.target(size_t(i)));
    return count;
  }

 private:
  const TaskData& d_;
  SequenceFormat format_;
  int64_t G_;
  uint64_t seed_;
  GlobalOrder order_;
  Augment augment_;
  std::vector<uint32_t> scratch_;  // an augmented example
};

}  // namespace

std::unique_ptr<Batches> make_lm_batches(const Mixture& data, int64_t T, int64_t global_batch,
                                         uint64_t seed, bool shuffle, bool document_mask) {
  return std::make_unique<LmBatches>(data, T, global_batch, seed, shuffle, document_mask);
}

TaskData load_task_data(const std::string& dir) {
  TaskData d;
  d.dir = dir;
  d.meta = read_task_meta(dir);
  d.train = read_examples((fs::path(dir) / "train.examples").string());
  d.val = read_examples((fs::path(dir) / "val.examples").string());
  TRELLIS_REQUIRE(d.train.size() > 0, "{}: train.examples holds no examples", dir);
  const int64_t K = int64_t(d.meta.classes.size());
  auto in_vocab = [&](std::span<const uint32_t> tokens) {
    return std::all_of(tokens.begin(), tokens.end(),
                       [&](uint32_t v) { return v < uint32_t(d.meta.vocab_size); });
  };
  for (const ExampleSet* set : {&d.train, &d.val})
    for (size_t i = 0; i < set->size(); ++i) {
      const int32_t label = set->labels[i];
      TRELLIS_REQUIRE(d.meta.task != "classify" || (label >= 0 && label < K),
                      "{}: example {} has label {}, outside the {} classes of meta.json", dir, i,
                      label, K);
      TRELLIS_REQUIRE(
          d.meta.feature_dim > 0 || (in_vocab(set->source(i)) && in_vocab(set->target(i))),
          "{}: example {} holds a token outside the vocabulary ({})", dir, i, d.meta.vocab_size);
      TRELLIS_REQUIRE(
          d.meta.feature_dim == 0 || set->source(i).size() % size_t(d.meta.feature_dim) == 0,
          "{}: example {} is not a whole number of {}-value patches", dir, i, d.meta.feature_dim);
      TRELLIS_REQUIRE(
          d.meta.image_height == 0 ||
              set->source(i).size() == size_t(d.meta.image_height) * size_t(d.meta.image_width),
          "{}: example {} holds {} pixels, not a {}x{} image", dir, i, set->source(i).size(),
          d.meta.image_height, d.meta.image_width);
    }
  return d;
}

SequenceFormat::SequenceFormat(const TaskMeta& meta, int64_t T_, int context)
    : task(meta.task),
      special(meta.special_token),
      feature_dim(meta.feature_dim),
      T(T_),
      patch_context(context) {
  if (context == 0) return;
  TRELLIS_CHECK(meta.feature_dim > 0 && meta.image_height > 0,
                "patch_context {} on data without image geometry", context);
  grid_rows = meta.image_height / meta.patch_height;
  grid_cols = meta.image_width / meta.patch_width;
}

int SequenceFormat::input_features() const {
  return feature_dim * (2 * patch_context + 1) * (2 * patch_context + 1);
}

int64_t SequenceFormat::needed(std::span<const uint32_t> source,
                               std::span<const uint32_t> target) const {
  if (feature_dim > 0) return int64_t(source.size()) / feature_dim;
  if (task == "classify") return int64_t(source.size()) + 2;
  return std::max(source.size(), target.size()) + 1;
}

int64_t SequenceFormat::targets(std::span<const uint32_t> target) const {
  return task == "classify" ? 1 : int64_t(target.size()) + 1;
}

namespace {
// Task inputs the Context holds per row (ModelChunk::prepare sizes tokens and targets only).
void size_task_inputs(Context& ctx, const SequenceFormat& f) {
  const size_t B = size_t(ctx.B), BT = size_t(ctx.B * ctx.T);
  if (ctx.lengths.size() != B) ctx.lengths.assign(B, 1);
  if (ctx.labels.size() != B) ctx.labels.assign(B, -1);
  if (f.task == "translate" && ctx.src_tokens.size() != BT) ctx.src_tokens.assign(BT, 0);
  const size_t F = size_t(f.input_features());
  if (F > 0 && ctx.features.size() != BT * F) ctx.features.assign(BT * F, 0.0f);
}
}  // namespace

void SequenceFormat::put(Context& ctx, int64_t r, std::span<const uint32_t> source,
                         std::span<const uint32_t> target, int32_t label) const {
  TRELLIS_CHECK(ctx.T == T, "context of {} positions for sequences of {}", ctx.T, T);
  size_task_inputs(ctx, *this);
  int32_t* tok = ctx.tokens.data() + r * T;
  int32_t* tgt = ctx.targets.data() + r * T;
  std::fill_n(tok, T, special);
  std::fill_n(tgt, T, -1);
  ctx.labels[size_t(r)] = label;
  if (feature_dim > 0) {  // patches of pixel bytes, scaled to [0, 1]
    const int64_t n = std::min<int64_t>(int64_t(source.size()) / feature_dim, T);
    const int64_t F = input_features(), c = patch_context;
    float* f = ctx.features.data() + r * T * F;
    std::fill_n(f, T * F, 0.0f);
    if (c == 0)
      for (int64_t i = 0; i < n * F; ++i) f[i] = float(source[size_t(i)]) / 255.0f;
    for (int64_t p = 0; c > 0 && p < n; ++p) {
      const int64_t y = p / grid_cols, x = p % grid_cols;
      float* out = f + p * F;
      for (int64_t dy = -c; dy <= c; ++dy)
        for (int64_t dx = -c; dx <= c; ++dx, out += feature_dim) {
          if (y + dy < 0 || y + dy >= grid_rows || x + dx < 0 || x + dx >= grid_cols)
            continue;  // off the image: zeros
          const uint32_t* in = source.data() + ((y + dy) * grid_cols + x + dx) * feature_dim;
          for (int64_t i = 0; i < feature_dim; ++i) out[i] = float(in[i]) / 255.0f;
        }
    }
    ctx.lengths[size_t(r)] = int32_t(n);
    return;
  }
  if (task == "classify") {  // [S] text [S], the text truncated to fit
    const int64_t n = std::min<int64_t>(int64_t(source.size()), T - 2);
    for (int64_t t = 0; t < n; ++t) tok[t + 1] = int32_t(source[size_t(t)]);
    ctx.lengths[size_t(r)] = int32_t(n + 2);
    return;
  }
  TRELLIS_REQUIRE(needed(source, target) <= T,
                  "a translation pair needs {} positions, more than seq_len {}",
                  needed(source, target), T);
  int32_t* src = ctx.src_tokens.data() + r * T;
  std::fill_n(src, T, special);
  for (size_t t = 0; t < source.size(); ++t) src[t] = int32_t(source[t]);
  ctx.lengths[size_t(r)] = int32_t(source.size() + 1);
  for (size_t t = 0; t < target.size(); ++t) {
    tok[t + 1] = int32_t(target[t]);
    tgt[t] = int32_t(target[t]);
  }
  tgt[target.size()] = special;
}

void SequenceFormat::put_padding(Context& ctx, int64_t r) const {
  put(ctx, r, {}, {}, -1);
  std::fill_n(ctx.targets.data() + r * T, T, -1);
  if (feature_dim > 0) ctx.lengths[size_t(r)] = 1;
}

int64_t task_seq_len(const TaskData& d) {
  const SequenceFormat f(d.meta, 0);
  int64_t n = 1;
  for (const ExampleSet* set : {&d.train, &d.val})
    for (size_t i = 0; i < set->size(); ++i)
      n = std::max(n, f.needed(set->source(i), set->target(i)));
  return n;
}

std::unique_ptr<Batches> make_task_batches(const TaskData& d, int64_t T, int64_t global_batch,
                                           uint64_t seed, bool shuffle, const Augment& augment,
                                           int patch_context) {
  if (augment.any())
    TRELLIS_REQUIRE(d.meta.image_height > 0, "augment: {} holds no image geometry", d.dir);
  return std::make_unique<TaskBatches>(d, T, global_batch, seed, shuffle, augment,
                                       patch_context);
}

}  // namespace trellis
