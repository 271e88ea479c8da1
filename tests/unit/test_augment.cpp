// Image augmentation (data/augment.h): the library's result on stored examples (patches) against
// a straightforward implementation on whole images written here, for given offsets and flips; the
// draws' determinism and distribution; and the input errors of `augment`.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/data/augment.h"

namespace trellis {
namespace {

using Image = std::vector<std::vector<int>>;  // [y][x]

TaskMeta image_meta(int H, int W, int ph, int pw) {
  TaskMeta m;
  m.task = "classify";
  m.feature_dim = ph * pw;
  m.image_height = H;
  m.image_width = W;
  m.patch_height = ph;
  m.patch_width = pw;
  return m;
}

Image random_image(int H, int W, unsigned seed) {
  Image im(size_t(H), std::vector<int>(size_t(W), 0));
  unsigned s = seed;
  for (auto& row : im)
    for (int& v : row) {
      s = s * 1103515245u + 12345u;
      v = 1 + int((s >> 16) % 255);  // never 0, so the zero fill is visible
    }
  return im;
}

// The stored form: patches in row-major patch order, each patch's pixels row-major
// (`prepare --task classify` of idx images).
std::vector<uint32_t> to_patches(const Image& im, int ph, int pw) {
  std::vector<uint32_t> out;
  const int H = int(im.size()), W = int(im[0].size());
  for (int py = 0; py < H / ph; ++py)
    for (int px = 0; px < W / pw; ++px)
      for (int y = 0; y < ph; ++y)
        for (int x = 0; x < pw; ++x)
          out.push_back(uint32_t(im[size_t(py * ph + y)][size_t(px * pw + x)]));
  return out;
}

Image from_patches(const std::vector<uint32_t>& p, int H, int W, int ph, int pw) {
  Image im(size_t(H), std::vector<int>(size_t(W), -1));
  size_t k = 0;
  for (int py = 0; py < H / ph; ++py)
    for (int px = 0; px < W / pw; ++px)
      for (int y = 0; y < ph; ++y)
        for (int x = 0; x < pw; ++x) im[size_t(py * ph + y)][size_t(px * pw + x)] = int(p[k++]);
  return im;
}

// The reference: flip the image (x -> W-1-x), then move it down by dy and right by dx into a
// zero image.
Image reference(const Image& im, int dy, int dx, bool flip) {
  const int H = int(im.size()), W = int(im[0].size());
  Image flipped = im;
  if (flip)
    for (auto& row : flipped) std::reverse(row.begin(), row.end());
  Image out(size_t(H), std::vector<int>(size_t(W), 0));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const int ty = y + dy, tx = x + dx;
      if (ty >= 0 && ty < H && tx >= 0 && tx < W)
        out[size_t(ty)][size_t(tx)] = flipped[size_t(y)][size_t(x)];
    }
  return out;
}

Image augmented(const Image& im, const TaskMeta& m, AugmentDraw d) {
  const auto in = to_patches(im, m.patch_height, m.patch_width);
  std::vector<uint32_t> out(in.size(), 12345u);
  augment_image(m, d, in, out);
  return from_patches(out, m.image_height, m.image_width, m.patch_height, m.patch_width);
}

TEST(Augment, MatchesAStraightforwardImplementationOnWholeImages) {
  struct Geometry {
    int H, W, ph, pw;
  };
  // Square and non-square images and patches; 1xW patches (rows), whole-image patches.
  for (const Geometry g : {Geometry{28, 28, 7, 7}, Geometry{4, 6, 2, 3}, Geometry{6, 4, 1, 4},
                           Geometry{5, 5, 5, 5}, Geometry{8, 6, 4, 2}}) {
    const TaskMeta m = image_meta(g.H, g.W, g.ph, g.pw);
    for (unsigned seed : {1u, 2u, 3u}) {
      const Image im = random_image(g.H, g.W, seed);
      for (int dy : {-3, -1, 0, 2})
        for (int dx : {-2, 0, 1, 3})
          for (bool flip : {false, true})
            ASSERT_EQ(augmented(im, m, {dy, dx, flip}), reference(im, dy, dx, flip))
                << g.H << "x" << g.W << " in " << g.ph << "x" << g.pw << " patches, dy " << dy
                << " dx " << dx << " flip " << flip;
    }
  }
}

TEST(Augment, SmallCasesWrittenOut) {
  // A 2x3 image in 1x3 patches (its rows), as stored: 1 2 3 / 4 5 6.
  const TaskMeta m = image_meta(2, 3, 1, 3);
  const std::vector<uint32_t> in = {1, 2, 3, 4, 5, 6};
  auto run = [&](AugmentDraw d) {
    std::vector<uint32_t> out(6);
    augment_image(m, d, in, out);
    return out;
  };
  EXPECT_EQ(run({0, 0, false}), in);
  EXPECT_EQ(run({0, 1, false}), (std::vector<uint32_t>{0, 1, 2, 0, 4, 5}));   // right by 1
  EXPECT_EQ(run({0, -1, false}), (std::vector<uint32_t>{2, 3, 0, 5, 6, 0}));  // left by 1
  EXPECT_EQ(run({1, 0, false}), (std::vector<uint32_t>{0, 0, 0, 1, 2, 3}));   // down by 1
  EXPECT_EQ(run({0, 0, true}), (std::vector<uint32_t>{3, 2, 1, 6, 5, 4}));    // mirrored
  EXPECT_EQ(run({-1, 1, true}), (std::vector<uint32_t>{0, 6, 5, 0, 0, 0}));   // mirrored, up, right
}

TEST(Augment, DrawsArePureFunctionsOfSeedEpochAndExample) {
  const Augment a{2, true};
  std::map<int, int> dys, dxs;
  int flips = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const AugmentDraw d = augment_draw(a, 7, 3, i), again = augment_draw(a, 7, 3, i);
    EXPECT_EQ(d.dy, again.dy);
    EXPECT_EQ(d.dx, again.dx);
    EXPECT_EQ(d.flip, again.flip);
    ASSERT_GE(d.dy, -2);
    ASSERT_LE(d.dy, 2);
    ASSERT_GE(d.dx, -2);
    ASSERT_LE(d.dx, 2);
    ++dys[d.dy];
    ++dxs[d.dx];
    flips += d.flip;
  }
  // Uniform over the 5 offsets (800 each; 5 sigma ~ 130) and a fair flip.
  EXPECT_EQ(dys.size(), 5u);
  EXPECT_EQ(dxs.size(), 5u);
  for (const auto* h : {&dys, &dxs})
    for (const auto& [v, c] : *h) EXPECT_NEAR(c, n / 5, 130) << v;
  EXPECT_NEAR(flips, n / 2, 160);
  // Other epochs, seeds and examples draw differently.
  auto key = [](AugmentDraw d) { return (d.dy + 2) * 10 + (d.dx + 2) * 2 + int(d.flip); };
  int same_epoch = 0, same_seed = 0;
  for (int i = 0; i < 200; ++i) {
    same_epoch += key(augment_draw(a, 7, 3, i)) == key(augment_draw(a, 7, 4, i));
    same_seed += key(augment_draw(a, 7, 3, i)) == key(augment_draw(a, 8, 3, i));
  }
  EXPECT_LT(same_epoch, 30);  // 1 in 50 by chance
  EXPECT_LT(same_seed, 30);
  // Without the operation, nothing is drawn.
  const AugmentDraw none = augment_draw(Augment{}, 7, 3, 5);
  EXPECT_EQ(none.dy, 0);
  EXPECT_EQ(none.dx, 0);
  EXPECT_FALSE(none.flip);
  const AugmentDraw flip_only = augment_draw(Augment{0, true}, 7, 3, 5);
  EXPECT_EQ(flip_only.dy, 0);
  EXPECT_EQ(flip_only.dx, 0);
}

template <typename F>
void expect_input_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected trellis::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' lacks '" << n << "'";
  }
}

TEST(Augment, ParsesAndRefusesBadValuesNamingTheKey) {
  EXPECT_FALSE(parse_augment("").any());
  const Augment a = parse_augment("shift:2,flip");
  EXPECT_EQ(a.shift, 2);
  EXPECT_TRUE(a.flip);
  EXPECT_EQ(parse_augment("flip").shift, 0);
  EXPECT_FALSE(parse_augment("shift:3").flip);
  expect_input_error([] { parse_augment("rotate:10"); },
                     {"augment", "unknown operation", "rotate"});
  expect_input_error([] { parse_augment("shift:2,"); }, {"augment", "unknown operation"});
  expect_input_error([] { parse_augment("shift:0"); }, {"augment", "out of range"});
  expect_input_error([] { parse_augment("shift:-1"); }, {"augment", "out of range"});
  expect_input_error([] { parse_augment("shift:x"); }, {"augment", "out of range"});
  expect_input_error([] { parse_augment("flip,flip"); }, {"augment", "twice"});
  // Against the data: images only, a shift below the image size, a recorded geometry.
  const TaskMeta images = image_meta(4, 6, 2, 3);
  EXPECT_EQ(check_augment("shift:3", &images, "d").shift, 3);
  expect_input_error([&] { check_augment("shift:4", &images, "d"); },
                     {"augment", "out of range", "4x6"});
  TaskMeta text;
  text.task = "classify";
  expect_input_error([&] { check_augment("flip", &text, "texts"); }, {"augment", "image", "texts"});
  expect_input_error([] { check_augment("flip", nullptr, ""); }, {"augment", "image", "built-in"});
  EXPECT_FALSE(check_augment("", nullptr, "").any());
  TaskMeta old = images;
  old.image_height = old.image_width = old.patch_height = old.patch_width = 0;
  expect_input_error([&] { check_augment("flip", &old, "d"); },
                     {"augment", "prepare the data again"});
}

}  // namespace
}  // namespace trellis
