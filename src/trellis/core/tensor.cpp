#include "trellis/core/tensor.h"

#include <cstring>

#include "trellis/core/error.h"

namespace trellis {

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

const char* dtype_name(DType t) { return t == DType::F32 ? "f32" : "bf16"; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  TRELLIS_CHECK(device == Device::CPU, "only CPU tensors can be allocated in this build");
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  const size_t bytes = t.bytes();
  // 64-byte aligned for the SIMD kernels; value-initialised, so zero.
  t.storage_ = std::shared_ptr<std::byte[]>(
      new (std::align_val_t(64)) std::byte[bytes ? bytes : 1](),
      [](std::byte* p) { operator delete[](p, std::align_val_t(64)); });
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::view(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

float* Tensor::f32() {
  TRELLIS_CHECK(dtype_ == DType::F32, "tensor holds {}, read as f32", dtype_name(dtype_));
  return static_cast<float*>(data_);
}

const float* Tensor::f32() const { return const_cast<Tensor*>(this)->f32(); }

uint16_t* Tensor::bf16() {
  TRELLIS_CHECK(dtype_ == DType::BF16, "tensor holds {}, read as bf16", dtype_name(dtype_));
  return static_cast<uint16_t*>(data_);
}

const uint16_t* Tensor::bf16() const { return const_cast<Tensor*>(this)->bf16(); }

void Tensor::reshape(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  TRELLIS_CHECK(n == numel(), "reshape of {} elements to {}", numel(), n);
  shape_ = std::move(shape);
}

void fit(Tensor& t, std::vector<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (t.owned() && t.dtype() == dtype && t.numel() == n) {
    t.reshape(std::move(shape));
    return;
  }
  t = Tensor::zeros(std::move(shape), dtype);
}

}  // namespace trellis
