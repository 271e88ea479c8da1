#include "trellis/io/tfevents.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "trellis/core/error.h"

namespace trellis {

namespace {

// Reflected Castagnoli polynomial; TFRecord uses CRC32C, not zlib's CRC32.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire format, just the pieces Event/Summary need.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (uint64_t(field) << 3) | wire_type);
}
template <typename T>
void put_fixed_le(std::string& out, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  unsigned char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));  // little-endian host, as the wire format wants
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}
void put_double(std::string& out, uint32_t field, double v) {
  put_tag(out, field, 1);  // 64-bit
  put_fixed_le(out, v);
}
void put_float(std::string& out, uint32_t field, float v) {
  put_tag(out, field, 5);  // 32-bit
  put_fixed_le(out, v);
}
void put_bytes(std::string& out, uint32_t field, const std::string& v) {
  put_tag(out, field, 2);  // length-delimited
  put_varint(out, v.size());
  out += v;
}
void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, 0);  // varint; negative int64 takes ten bytes, as protobuf specifies
  put_varint(out, static_cast<uint64_t>(v));
}

double wall_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  // TFRecord masks the CRC so that a CRC over data containing CRCs stays well distributed.
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TRELLIS_REQUIRE(!ec, "{}: cannot create directory: {}", dir, ec.message());
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const double now = wall_time_now();
  const std::string base =
      (std::filesystem::path(dir) /
       fmt::format("events.out.tfevents.{}.{}", static_cast<long long>(now), host))
          .string();
  // Exclusive create: a second writer started within the same second (a rerun, another rank on
  // this host) gets a numbered sibling instead of truncating or interleaving with the first.
  path_ = base;
  for (int n = 1; (f_ = std::fopen(path_.c_str(), "wbx")) == nullptr && errno == EEXIST && n < 1000;
       ++n)
    path_ = fmt::format("{}.{}", base, n);
  TRELLIS_REQUIRE(f_ != nullptr, "{}: cannot open: {}", path_, std::strerror(errno));
  std::string event;
  put_double(event, 1, now);
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
  flush();
}

EventWriter::~EventWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void EventWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  std::string val;  // Summary.Value
  put_bytes(val, 1, tag);
  put_float(val, 2, static_cast<float>(value));  // simple_value is a proto float
  std::string summary;
  put_bytes(summary, 1, val);
  std::string event;
  put_double(event, 1, wall_time_now());
  put_int64(event, 2, step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void EventWriter::flush() {
  TRELLIS_REQUIRE(std::fflush(f_) == 0, "{}: cannot write: {}", path_, std::strerror(errno));
}

void EventWriter::write_record(const std::string& payload) {
  std::string rec;
  rec.reserve(payload.size() + 16);
  put_fixed_le(rec, static_cast<uint64_t>(payload.size()));
  put_fixed_le(rec, masked_crc32c(rec.data(), 8));
  rec += payload;
  put_fixed_le(rec, masked_crc32c(payload.data(), payload.size()));
  TRELLIS_REQUIRE(std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size(), "{}: cannot write: {}",
                  path_, std::strerror(errno));
}

}  // namespace trellis
