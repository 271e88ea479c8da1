// Rotary position embedding (Hugging Face LLaMA's rotate_half layout). Angles and their cos/sin
// are evaluated in double and rounded once to float, so large positions lose no accuracy to a
// float angle; the rotation itself is float, like the cached cos/sin tables of the reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
// Rotates each pair (i, i + hd/2) of every head by sign * angle(pos, i).
void rope_rotate(float* x, int64_t ld, int64_t rows, int64_t row0, int64_t T, int64_t n_heads,
                 int64_t hd, float theta, float sign, const int32_t* pos) {
  TRELLIS_CHECK(hd % 2 == 0 && hd > 0, "rope: head width {} must be even", hd);
  TRELLIS_CHECK(n_heads * hd <= ld, "rope: {} heads of {} exceed the row stride {}", n_heads, hd,
                ld);
  const int64_t half = hd / 2;
  // cos/sin once per distinct position (rows of a batch repeat positions, and a libm sin/cos
  // costs more than rotating a head): entry e holds position (row0 + e) % T, row r uses r % np.
  // With explicit positions (documents of a packed row), entry e holds position e and row r
  // uses pos[row0 + r].
  for (int64_t r = 0; pos && r < rows; ++r)
    TRELLIS_CHECK(pos[row0 + r] >= 0 && pos[row0 + r] < T, "rope: position {} of row {} outside "
                  "[0, {})", pos[row0 + r], row0 + r, T);
  const int64_t np = pos ? T : std::min(rows, T);
  const int64_t first = pos ? 0 : row0;
  std::vector<float> cs(size_t(np * half)), sn(size_t(np * half));
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < np; ++e)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double((first + e) % T) * std::pow(double(theta), -2.0 * double(i) / hd);
      cs[size_t(e * half + i)] = float(std::cos(a));
      sn[size_t(e * half + i)] = sign * float(std::sin(a));
    }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t e = pos ? pos[row0 + r] : r % np;
    const float* c = cs.data() + e * half;
    const float* s = sn.data() + e * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* x0 = x + r * ld + h * hd;
      float* x1 = x0 + half;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x0[i], b = x1[i];
        x0[i] = a * c[i] - b * s[i];
        x1[i] = b * c[i] + a * s[i];
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, int64_t ld, int64_t rows, int64_t row0, int64_t T, int64_t n_heads,
                  int64_t hd, float theta, const int32_t* pos) {
  rope_rotate(x, ld, rows, row0, T, n_heads, hd, theta, 1.0f, pos);
}

// The rotation is orthogonal, so its transpose (the rotation by -angle) maps the gradient back.
void rope_backward(float* dx, int64_t ld, int64_t rows, int64_t row0, int64_t T, int64_t n_heads,
                   int64_t hd, float theta, const int32_t* pos) {
  rope_rotate(dx, ld, rows, row0, T, n_heads, hd, theta, -1.0f, pos);
}

}  // namespace trellis::ops
