#pragma once
// Tensor: a shape, an element type, a device and storage that is either owned (activations,
// scratch) or a view into someone else's memory (parameters and gradients are views into the
// flat buffers of DESIGN invariant 4). Kernels take raw pointers; a Tensor hands them out after
// checking the element type, so a bf16 buffer is never read as f32 by mistake.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace trellis {

enum class DType : uint8_t { F32, BF16 };
enum class Device : uint8_t { CPU, CUDA };  // only CPU kernels exist so far

size_t dtype_size(DType t);
const char* dtype_name(DType t);

class Tensor {
 public:
  Tensor() = default;
  // Owned, zero-filled.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::F32,
                      Device device = Device::CPU);
  // A view of memory that outlives the tensor.
  static Tensor view(void* data, std::vector<int64_t> shape, DType dtype = DType::F32,
                     Device device = Device::CPU);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[size_t(i)]; }
  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool owned() const { return storage_ != nullptr; }
  bool empty() const { return numel() == 0; }

  // The same elements under another shape (same count).
  void reshape(std::vector<int64_t> shape);

  void* data() { return data_; }
  const void* data() const { return data_; }
  float* f32();
  const float* f32() const;
  uint16_t* bf16();  // bf16 bits
  const uint16_t* bf16() const;

 private:
  std::shared_ptr<std::byte[]> storage_;
  void* data_ = nullptr;
  std::vector<int64_t> shape_{0};
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Makes t an owned zero tensor of `shape` unless it already holds exactly that many elements of
// `dtype` (activation buffers are sized once per micro-batch shape and reused).
void fit(Tensor& t, std::vector<int64_t> shape, DType dtype = DType::F32);

}  // namespace trellis
