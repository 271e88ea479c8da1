#include "trellis/data/augment.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/core/philox.h"

namespace trellis {

Augment parse_augment(const std::string& spec) {
  Augment a;
  if (spec.empty()) return a;
  const std::string usage =
      "expected a comma-separated list of shift:N and flip, e.g. shift:2,flip";
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string op = spec.substr(pos, comma - pos);
    if (op == "flip") {
      TRELLIS_REQUIRE(!a.flip, "augment '{}': flip given twice", spec);
      a.flip = true;
    } else if (op.rfind("shift:", 0) == 0) {
      TRELLIS_REQUIRE(a.shift == 0, "augment '{}': shift given twice", spec);
      const std::string n = op.substr(6);
      const bool digits =
          !n.empty() && n.size() <= 4 &&
          std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; });
      TRELLIS_REQUIRE(digits && std::stoi(n) >= 1,
                      "augment '{}': shift '{}' is out of range: give shift:N with N >= 1 pixels "
                      "(below the image's height and width)",
                      spec, n);
      a.shift = std::stoi(n);
    } else {
      TRELLIS_REQUIRE(false, "augment '{}': unknown operation '{}' ({})", spec, op, usage);
    }
    pos = comma + 1;
  }
  return a;
}

Augment check_augment(const std::string& spec, const TaskMeta* meta, const std::string& data) {
  const Augment a = parse_augment(spec);
  if (!a.any()) return a;
  const std::string what = data.empty() ? "the built-in corpus" : data;
  TRELLIS_REQUIRE(
      meta && meta->feature_dim > 0,
      "augment '{}' applies to image tasks (`trellis prepare --task classify` of an idx "
      "image directory); data {} holds {}",
      spec, what,
      meta ? meta->task + " examples of tokens (text)" : "language-model tokens (text)");
  TRELLIS_REQUIRE(meta->image_height > 0,
                  "augment '{}': {}/meta.json does not record the image and patch sizes (prepared "
                  "by an older trellis): prepare the data again",
                  spec, what);
  TRELLIS_REQUIRE(a.shift < meta->image_height && a.shift < meta->image_width,
                  "augment '{}': shift {} is out of range for the {}x{} images of {} (at most {})",
                  spec, a.shift, meta->image_height, meta->image_width, what,
                  std::min(meta->image_height, meta->image_width) - 1);
  return a;
}

AugmentDraw augment_draw(const Augment& a, uint64_t seed, int64_t epoch, int64_t example) {
  // One stream per epoch, three draws per example: dy, dx, flip.
  const uint64_t stream = name_hash("augment") + uint64_t(epoch);
  const uint64_t at = uint64_t(example) * 3;
  AugmentDraw d;
  if (a.shift > 0) {
    const int span = 2 * a.shift + 1;
    d.dy = int(std::floor(philox_uniform(seed, stream, at) * span)) - a.shift;
    d.dx = int(std::floor(philox_uniform(seed, stream, at + 1) * span)) - a.shift;
  }
  if (a.flip) d.flip = philox_uniform(seed, stream, at + 2) < 0.5;
  return d;
}

void augment_image(const TaskMeta& meta, const AugmentDraw& d, std::span<const uint32_t> in,
                   std::span<uint32_t> out) {
  const int H = meta.image_height, W = meta.image_width;
  const int ph = meta.patch_height, pw = meta.patch_width;
  TRELLIS_CHECK(H > 0 && W > 0 && ph > 0 && pw > 0 && H % ph == 0 && W % pw == 0,
                "augment: image {}x{} in patches of {}x{}", H, W, ph, pw);
  TRELLIS_CHECK(in.size() == size_t(H) * W && out.size() == in.size(),
                "augment: an example of {} values for {}x{} images", in.size(), H, W);
  // Where pixel (y, x) of the image sits in the stored patch order (row-major patches, each
  // row-major): data/prepare_task.cpp's patch_examples.
  const int per_patch_row = (W / pw) * ph * pw;
  auto at = [&](int y, int x) {
    return size_t((y / ph) * per_patch_row + (x / pw) * ph * pw + (y % ph) * pw + x % pw);
  };
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const int sy = y - d.dy, mx = x - d.dx;
      const int sx = d.flip ? W - 1 - mx : mx;
      out[at(y, x)] = sy >= 0 && sy < H && mx >= 0 && mx < W ? in[at(sy, sx)] : 0u;
    }
}

}  // namespace trellis
