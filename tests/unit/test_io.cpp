// io/: atomic files, safetensors, TensorBoard event files, the metrics plot.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/io/plot.h"
#include "trellis/io/safetensors.h"
#include "trellis/io/tfevents.h"

namespace fs = std::filesystem;
using namespace trellis;

namespace {

// A fresh directory per test, removed afterwards.
class IoFormats : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           fmt::format("trellis_io_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Runs fn, expects an input Error, and returns its message.
template <typename F>
std::string input_error(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected trellis::Error";
  return "";
}

std::string st_file(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header_json.size();
  std::memcpy(out.data(), &n, 8);
  return out + header_json + data;
}

uint64_t u64_at(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

// Minimal protobuf reader for the test: returns (field, wire type, value or bytes).
struct Field {
  uint32_t number = 0, wire = 0;
  uint64_t varint = 0;
  std::string bytes;
};
uint64_t read_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(i++));
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}
std::vector<Field> parse_proto(const std::string& s) {
  std::vector<Field> out;
  size_t i = 0;
  while (i < s.size()) {
    Field f;
    const uint64_t key = read_varint(s, i);
    f.number = uint32_t(key >> 3);
    f.wire = uint32_t(key & 7);
    if (f.wire == 0) {
      f.varint = read_varint(s, i);
    } else if (f.wire == 1) {
      f.bytes = s.substr(i, 8), i += 8;
    } else if (f.wire == 5) {
      f.bytes = s.substr(i, 4), i += 4;
    } else if (f.wire == 2) {
      const uint64_t n = read_varint(s, i);
      f.bytes = s.substr(i, n), i += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << f.wire;
      break;
    }
    out.push_back(f);
  }
  EXPECT_EQ(i, s.size());
  return out;
}

}  // namespace

// ---------------------------------------------------------------- atomic_file

TEST_F(IoFormats, AtomicWriteRoundTripLeavesNoTempFiles) {
  const std::string p = file("a.bin");
  std::string bytes("hello\0world", 11);
  write_file_atomic(p, bytes);
  write_file_atomic(p, bytes + "!");  // replacing an existing file
  EXPECT_EQ(read_file(p), bytes + "!");
  write_file_atomic(file("empty"), "");
  EXPECT_EQ(read_file(file("empty")), "");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.bin", "empty"}));
}

TEST_F(IoFormats, AtomicWriteFailureNamesPathAndLeavesNothing) {
  const std::string p = file("no_such_dir/x.bin");
  const std::string msg = input_error([&] { write_file_atomic(p, "x"); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(IoFormats, ReadMissingFileNamesIt) {
  const std::string p = file("missing.txt");
  const std::string msg = input_error([&] { read_file(p); });
  EXPECT_EQ(msg, p + ": cannot open: No such file or directory");
}

// ---------------------------------------------------------------- safetensors

TEST_F(IoFormats, SafetensorsRoundTripWithMetadata) {
  std::vector<float> a(6), b(4), s{3.5f};
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 1e-30f * float(i + 1);
  const std::string p = file("m.safetensors");
  // Deliberately unsorted: the writer sorts by name.
  write_safetensors(p,
                    {{"z.weight", {2, 3}, a.data()},
                     {"a.bias", {4}, b.data()},
                     {"scalar", {}, s.data()},
                     {"empty", {0, 5}, nullptr}},
                    {{"format", "pt"}, {"step", "42"}});
  SafetensorsFile f(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.bias", "empty", "scalar", "z.weight"}));
  EXPECT_EQ(f.shape("z.weight"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.shape("scalar"), (std::vector<int64_t>{}));
  EXPECT_EQ(f.shape("empty"), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(std::memcmp(f.data("z.weight"), a.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(f.data("a.bias"), b.data(), b.size() * 4), 0);
  EXPECT_EQ(f.data("scalar")[0], 3.5f);
  EXPECT_TRUE(f.has("a.bias"));
  EXPECT_FALSE(f.has("nope"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "42");

  // Layout: header padded to 8, entries sorted, offsets contiguous from 0.
  const std::string raw = read_file(p);
  const uint64_t hlen = u64_at(raw, 0);
  EXPECT_EQ(hlen % 8, 0u);
  const auto header = nlohmann::json::parse(raw.substr(8, hlen));
  EXPECT_EQ(header["a.bias"]["data_offsets"], nlohmann::json({0, 16}));
  EXPECT_EQ(header["a.bias"]["dtype"], "F32");
  EXPECT_EQ(raw.size(), 8 + hlen + (6 + 4 + 1) * 4);

  const std::string msg = input_error([&] { f.data("nope"); });
  EXPECT_NE(msg.find(p), std::string::npos);
  EXPECT_NE(msg.find("nope"), std::string::npos);
}

TEST_F(IoFormats, SafetensorsUnalignedDataIsUsable) {
  // A foreign writer with an unpadded header: the data section starts at an odd offset.
  float v[2] = {1.25f, -2.5f};
  std::string data(reinterpret_cast<const char*>(v), 8);
  const std::string p = file("odd.safetensors");
  write_file_atomic(p, st_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
  SafetensorsFile f(p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data("t")) % alignof(float), 0u);
  EXPECT_EQ(f.data("t")[0], 1.25f);
  EXPECT_EQ(f.data("t")[1], -2.5f);
}

TEST_F(IoFormats, SafetensorsHalfPrecisionWidensExactly) {
  // F16: 1, -2, 0.5 + 2^-11 (the smallest step above 0.5), 2^-24 (smallest subnormal), 6.1e-5
  // (largest subnormal 1023 * 2^-24), 65504 (largest finite), -0, inf. BF16: 1, -3.5, 2^-133
  // (a float subnormal), the float bits 0x4049 0000 (3.140625).
  const uint16_t f16[] = {0x3c00, 0xc000, 0x3801, 0x0001, 0x03ff, 0x7bff, 0x8000, 0x7c00};
  const uint16_t bf16[] = {0x3f80, 0xc060, 0x0001, 0x4049};
  float f32[3] = {0.25f, -1.5f, 7.0f};
  // An odd-sized F16 tensor first, so that the F32 tensor after it is misaligned in the file.
  const uint16_t odd[] = {0x3c00};
  std::string data(reinterpret_cast<const char*>(odd), 2);
  data += std::string(reinterpret_cast<const char*>(f16), sizeof f16);
  data += std::string(reinterpret_cast<const char*>(bf16), sizeof bf16);
  data += std::string(reinterpret_cast<const char*>(f32), sizeof f32);
  const std::string p = file("half.safetensors");
  write_file_atomic(p, st_file(R"({"odd":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
                               R"("h":{"dtype":"F16","shape":[2,4],"data_offsets":[2,18]},)"
                               R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[18,26]},)"
                               R"("f":{"dtype":"F32","shape":[3],"data_offsets":[26,38]}})",
                               data));
  SafetensorsFile f(p);
  EXPECT_EQ(f.dtype("h"), "F16");
  EXPECT_EQ(f.dtype("b"), "BF16");
  EXPECT_EQ(f.shape("h"), (std::vector<int64_t>{2, 4}));
  const std::vector<float> h = f.floats("h");
  ASSERT_EQ(h.size(), 8u);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f + std::ldexp(1.0f, -11));
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[4], 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(h[5], 65504.0f);
  EXPECT_TRUE(h[6] == 0.0f && std::signbit(h[6]));
  EXPECT_TRUE(std::isinf(h[7]) && h[7] > 0);
  EXPECT_EQ(f.floats("b"), (std::vector<float>{1.0f, -3.5f, std::ldexp(1.0f, -133), 3.140625f}));
  // F32 tensors keep their zero-copy pointer (aligned even here) and read the same via floats().
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data("f")) % alignof(float), 0u);
  EXPECT_EQ(f.data("f")[2], 7.0f);
  EXPECT_EQ(f.floats("f"), (std::vector<float>{0.25f, -1.5f, 7.0f}));
  // data() is for F32 only: a half tensor is an input error naming file and tensor.
  const std::string msg = input_error([&] { f.data("h"); });
  EXPECT_NE(msg.find(p + ": tensor 'h' is F16"), std::string::npos) << msg;
}

TEST_F(IoFormats, SafetensorsOtherDtypesLoadButAreNotFloats) {
  // Hugging Face files may hold bool masks or integer ids next to the weights: the file loads,
  // only reading such a tensor as floats is an error.
  const float w[2] = {1.0f, 2.0f};
  const int64_t ids[3] = {0, 1, 2};
  std::string data(reinterpret_cast<const char*>(w), 8);
  data += std::string(reinterpret_cast<const char*>(ids), 24) + std::string("\x01\x00", 2);
  const std::string p = file("mixed.safetensors");
  write_file_atomic(p, st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("ids":{"dtype":"I64","shape":[1,3],"data_offsets":[8,32]},)"
                               R"("mask":{"dtype":"BOOL","shape":[2],"data_offsets":[32,34]}})",
                               data));
  SafetensorsFile f(p);
  EXPECT_EQ(f.floats("w"), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(f.dtype("ids"), "I64");
  EXPECT_EQ(f.shape("mask"), (std::vector<int64_t>{2}));
  const std::string msg = input_error([&] { f.floats("ids"); });
  EXPECT_NE(msg.find(p + ": tensor 'ids' is I64"), std::string::npos) << msg;
  input_error([&] { f.data("mask"); });
}

TEST_F(IoFormats, SafetensorsCorruptFilesAreInputErrorsNamingTheFile) {
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;  // substring of the message besides the path
  };
  std::string big_len = st_file(good_header, data);
  const uint64_t huge = 1u << 20;
  std::memcpy(big_len.data(), &huge, 8);
  const std::vector<Case> cases = {
      {"short", "abc", "at least 8"},
      {"truncated_data", st_file(good_header, data).substr(0, 8 + good_header.size() + 4),
       "out of range"},
      {"header_too_long", big_len, "runs past the end of the file"},
      {"bad_json", st_file("{\"w\": [", data), "not valid JSON"},
      {"not_object", st_file("[1,2]", data), "not a JSON object"},
      {"bad_dtype", st_file(R"({"w":{"dtype":"F12","shape":[4],"data_offsets":[0,8]}})", data),
       "'w': unsupported dtype 'F12'"},
      {"half_size_mismatch",
       st_file(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", data), "needs 4"},
      {"offsets_out_of_range",
       st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data), "out of range"},
      {"end_before_begin",
       st_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data), "out of range"},
      {"size_mismatch", st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
       "needs 12"},
      {"negative_dim", st_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
       "negative"},
      {"overlap",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               data),
       "overlap"},
      {"gap", st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
       "belong to no tensor"},
      {"trailing", st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data),
       "belong to no tensor"},
      {"bad_metadata", st_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__"},
      {"missing_offsets", st_file(R"({"w":{"dtype":"F32","shape":[2]}})", data), "data_offsets"},
  };
  for (const Case& c : cases) {
    const std::string p = file(std::string(c.name) + ".safetensors");
    write_file_atomic(p, c.bytes);
    const std::string msg = input_error([&] { SafetensorsFile f(p); });
    EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg;
  }
  const std::string missing = file("missing.safetensors");
  EXPECT_NE(input_error([&] { SafetensorsFile f(missing); }).find(missing), std::string::npos);
}

// ---------------------------------------------------------------- tfevents

TEST(TfEvents, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_F(IoFormats, EventWriterRecordsHaveValidFraming) {
  const std::string tb = file("run/tb");  // parents are created
  std::string path;
  {
    EventWriter w(tb);
    path = w.path();
    w.add_scalar("train/loss", 1, 2.5);
    w.add_scalar("train/lr", 2, 3e-4);
    w.add_scalar("train/loss", -3, 0.125);  // negative steps still encode (10-byte varint)
    w.flush();
  }
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(tb));
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);

  const std::string raw = read_file(path);
  std::vector<std::string> payloads;
  size_t i = 0;
  while (i < raw.size()) {
    ASSERT_LE(i + 12, raw.size());
    const uint64_t len = u64_at(raw, i);
    EXPECT_EQ(u32_at(raw, i + 8), masked_crc32c(raw.data() + i, 8));
    ASSERT_LE(i + 12 + len + 4, raw.size());
    const std::string payload = raw.substr(i + 12, len);
    EXPECT_EQ(u32_at(raw, i + 12 + len), masked_crc32c(payload.data(), payload.size()));
    payloads.push_back(payload);
    i += 12 + len + 4;
  }
  ASSERT_EQ(payloads.size(), 4u);

  const auto first = parse_proto(payloads[0]);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].number, 1u);
  EXPECT_EQ(first[0].wire, 1u);
  EXPECT_EQ(first[1].number, 3u);
  EXPECT_EQ(first[1].bytes, "brain.Event:2");

  struct Want {
    std::string tag;
    int64_t step;
    float value;
  };
  const std::vector<Want> want = {
      {"train/loss", 1, 2.5f}, {"train/lr", 2, 3e-4f}, {"train/loss", -3, 0.125f}};
  for (size_t k = 0; k < want.size(); ++k) {
    const auto ev = parse_proto(payloads[k + 1]);
    ASSERT_EQ(ev.size(), 3u);
    EXPECT_EQ(ev[0].number, 1u);  // wall_time
    double wall;
    std::memcpy(&wall, ev[0].bytes.data(), 8);
    EXPECT_GT(wall, 1.5e9);
    EXPECT_EQ(ev[1].number, 2u);
    EXPECT_EQ(static_cast<int64_t>(ev[1].varint), want[k].step);
    EXPECT_EQ(ev[2].number, 5u);
    const auto summary = parse_proto(ev[2].bytes);
    ASSERT_EQ(summary.size(), 1u);
    EXPECT_EQ(summary[0].number, 1u);
    const auto value = parse_proto(summary[0].bytes);
    ASSERT_EQ(value.size(), 2u);
    EXPECT_EQ(value[0].number, 1u);
    EXPECT_EQ(value[0].bytes, want[k].tag);
    EXPECT_EQ(value[1].number, 2u);
    EXPECT_EQ(value[1].wire, 5u);
    float v;
    std::memcpy(&v, value[1].bytes.data(), 4);
    EXPECT_EQ(v, want[k].value);
  }
}

TEST_F(IoFormats, EventWritersInSameSecondGetDistinctFiles) {
  EventWriter a(dir_.string()), b(dir_.string());
  EXPECT_NE(a.path(), b.path());
}

// ---------------------------------------------------------------- plot

TEST_F(IoFormats, PlotWritesSvgWithTrainAndValSeries) {
  std::string jsonl;
  for (int s = 1; s <= 50; ++s) {
    jsonl += fmt::format(R"({{"step": {}, "loss": {}, "lr": 0.001}})", s, 4.0 / (1 + 0.1 * s));
    jsonl += "\n";
    if (s % 10 == 0) jsonl += fmt::format("{{\"step\": {}, \"val_loss\": {}}}\n", s, 3.0 / s + 1);
  }
  jsonl += "\n";  // blank lines are fine
  write_file_atomic(file("metrics.jsonl"), jsonl);
  plot_metrics_svg(file("metrics.jsonl"), file("loss.svg"));
  const std::string svg = read_file(file("loss.svg"));
  EXPECT_TRUE(svg.rfind("<svg", 0) == 0 || svg.rfind("<?xml", 0) == 0);
  size_t polylines = 0;
  for (size_t at = 0; (at = svg.find("<polyline", at)) != std::string::npos; ++at) ++polylines;
  EXPECT_EQ(polylines, 2u);
  EXPECT_NE(svg.find("<circle"), std::string::npos);
  EXPECT_NE(svg.find("train loss"), std::string::npos);
  EXPECT_NE(svg.find("val loss"), std::string::npos);
  EXPECT_NE(svg.find(">50<"), std::string::npos);  // a round x tick at the last step
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST_F(IoFormats, PlotSinglePointIsDrawable) {
  write_file_atomic(file("m.jsonl"), "{\"step\": 3, \"loss\": 2.0}\n");
  plot_metrics_svg(file("m.jsonl"), file("o.svg"));
  const std::string svg = read_file(file("o.svg"));
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST_F(IoFormats, PlotErrors) {
  const std::string missing = file("missing.jsonl");
  EXPECT_EQ(input_error([&] { plot_metrics_svg(missing, file("o.svg")); }),
            missing + ": cannot open: No such file or directory");

  const std::string bad = file("bad.jsonl");
  write_file_atomic(bad, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": \n");
  EXPECT_EQ(input_error([&] { plot_metrics_svg(bad, file("o.svg")); }), bad + ":2: not JSON");

  const std::string none = file("none.jsonl");
  write_file_atomic(none, "{\"step\": 1, \"tokens_per_s\": 2}\n");
  const std::string msg = input_error([&] { plot_metrics_svg(none, file("o.svg")); });
  EXPECT_EQ(msg.rfind(none + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("no "), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(file("o.svg")));
}
