#pragma once
// TensorBoard event files (events.out.tfevents.*): TFRecord framing with masked CRC32C around
// hand-encoded Event/Summary protos holding scalars.
#include <cstdint>
#include <cstdio>
#include <string>

namespace trellis {

uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class EventWriter {
 public:
  // Creates dir (and parents) and a new events.out.tfevents.<time>.<host> file with the
  // file_version record.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(const std::string& tag, int64_t step, double value);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace trellis
