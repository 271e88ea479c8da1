#pragma once
// safetensors (https://huggingface.co/docs/safetensors): u64 header length, JSON header with
// {name: {dtype, shape, data_offsets}} and optional "__metadata__", then raw little-endian data.
// trellis writes F32; it reads F32, F16 and BF16 (Hugging Face checkpoints are often half
// precision).
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
  // Reads and validates the whole file: header length, JSON, dtypes (any of the format's),
  // offsets within the file, no overlap, size == product(shape) * element size. Errors are input
  // errors naming the file.
  explicit SafetensorsFile(const std::string& path);
  // The same over a file's bytes already in memory; `name` names it in errors.
  static SafetensorsFile from_bytes(std::string bytes, const std::string& name);
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  // "F32", "F16", "BF16", "I64", ...
  const std::string& dtype(const std::string& name) const;
  // Pointer to an F32 tensor's floats; throws an input error naming file and key when missing or
  // of another dtype.
  const float* data(const std::string& name) const;
  // The values of an F32, F16 or BF16 tensor as floats (F16 and BF16 widen exactly); another
  // dtype is an input error naming file and key.
  std::vector<float> floats(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    std::vector<int64_t> shape;
    std::string dtype;
    size_t offset = 0, count = 0, bytes = 0;
  };
  SafetensorsFile(std::string bytes, const std::string& name, bool);
  void parse();
  const Entry& entry(const std::string& name) const;
  std::string path_;
  std::string bytes_;
  size_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace trellis
