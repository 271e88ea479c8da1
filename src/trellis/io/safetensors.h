#pragma once
// safetensors (https://huggingface.co/docs/safetensors): u64 header length, JSON header with
// {name: {dtype, shape, data_offsets}} and optional "__metadata__", then raw little-endian data.
// F32 only, which is all trellis writes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trellis {

struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // shape-product floats, row-major
};

// Atomic write (temp + rename).
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsFile {
 public:
  // Reads and validates the whole file: header length, JSON, dtypes (F32 only), offsets within
  // the file, no overlap, size == product(shape)*4. Errors are input errors naming the file.
  explicit SafetensorsFile(const std::string& path);
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  // Pointer to the tensor's floats; throws an input error naming file and key when missing.
  const float* data(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    std::vector<int64_t> shape;
    size_t offset = 0, count = 0;
  };
  std::string path_;
  std::string bytes_;
  size_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace trellis
