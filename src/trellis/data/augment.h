#pragma once
// Data augmentation of image examples (`augment = "shift:2,flip"`): a random translation by up to
// N pixels in y and x with zero fill, and a horizontal flip with probability 1/2.
//
// It acts on the image, not on its patches: an example stores the pixel bytes of its patches
// (data/examples.h), so the image is rebuilt from the task's geometry (TaskMeta's image and
// patch sizes), moved, and cut into patches again. What an example gets is a pure function of
// (seed, epoch, the example's index in the training set) through Philox, never of the rank or
// layout (global truth for randomness), so every layout and a resumed run train on the same
// images.
// Training examples only: validation, `eval` and `classify` see the stored images.
#include <cstdint>
#include <span>
#include <string>

#include "trellis/data/examples.h"

namespace trellis {

struct Augment {
  int shift = 0;      // translation of up to this many pixels in each direction (0 = none)
  bool flip = false;  // horizontal flip with probability 1/2
  bool any() const { return shift > 0 || flip; }
};

// Parses a comma-separated list of operations: "shift:N" (N >= 1) and "flip"; empty = none.
// Bad values are input errors naming the key `augment`.
Augment parse_augment(const std::string& spec);

// The augmentation of a run, checked against its data: only image tasks (a task directory whose
// meta.json records the image geometry, `prepare --task classify` of an idx directory), and a
// shift below the image's height and width. meta is null for language-model data. Input errors
// name the key `augment` and `data`.
Augment check_augment(const std::string& spec, const TaskMeta* meta, const std::string& data);

// What one example gets: its offsets (each uniform in [-shift, shift]) and whether it is flipped.
struct AugmentDraw {
  int dy = 0, dx = 0;
  bool flip = false;
};
AugmentDraw augment_draw(const Augment& a, uint64_t seed, int64_t epoch, int64_t example);

// out = the example `in` (its patches' pixel bytes, as stored) augmented: with image(y, x) the
// stored image, out's image is
//   out(y, x) = image(y - dy, flip ? W-1-(x-dx) : x - dx), 0 where that lies outside,
// i.e. flipped first, then moved down by dy and right by dx. in and out hold
// image_height * image_width values each and must not overlap.
void augment_image(const TaskMeta& meta, const AugmentDraw& d, std::span<const uint32_t> in,
                   std::span<uint32_t> out);

}  // namespace trellis
