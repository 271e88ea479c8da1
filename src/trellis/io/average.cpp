#include "trellis/io/average.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "nlohmann/json.hpp"
#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/io/checkpoint.h"
#include "trellis/io/sharded_checkpoint.h"
#include "trellis/model/params.h"

namespace fs = std::filesystem;

namespace trellis {

namespace {

using json = nlohmann::json;

// The first key (dotted path, keys in sorted order) where two JSON values differ, with both
// values; an empty path when they are equal.
struct Difference {
  std::string key, a, b;
};
Difference first_difference(const json& a, const json& b, const std::string& at) {
  if (a == b) return {};
  if (!a.is_object() || !b.is_object()) return {at.empty() ? "(whole)" : at, a.dump(), b.dump()};
  auto path = [&](const std::string& k) { return at.empty() ? k : at + "." + k; };
  for (const auto& [k, v] : a.items()) {
    if (!b.contains(k)) return {path(k), v.dump(), "missing"};
    if (Difference d = first_difference(v, b[k], path(k)); !d.key.empty()) return d;
  }
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) return {path(k), "missing", v.dump()};
  return {};
}

// What must agree between the checkpoints' config.json: all of it but where the tokenizer's files
// were (two copies of one data directory make the same model).
json comparable_config(const std::string& dir) {
  json cfg = read_json_file((fs::path(dir) / "config.json").string());
  if (cfg.is_object() && cfg.contains("trellis") && cfg["trellis"].is_object())
    cfg["trellis"].erase("tokenizer_dir");
  return cfg;
}

// The saving layout as index.json records it, for messages.
std::string layout_text(const std::string& dir) {
  if (!is_sharded_checkpoint(dir)) return "whole-file";
  const json index = read_json_file((fs::path(dir) / "index.json").string());
  if (!index.contains("layout") || !index["layout"].is_object()) return "unrecorded layout";
  std::vector<std::string> parts;
  for (const char* k : {"world", "dp", "tp", "pp", "virtual_stages", "zero"})
    if (index["layout"].contains(k))
      parts.push_back(fmt::format("{} {}", k, index["layout"][k].dump()));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Refuses checkpoints b unlike a: tensors (names, shapes) first, as a model of another size names
// the tensor that differs, then config.json's keys, then how each tensor is stored.
void require_alike(const std::string& a, const ParamLayout& la, CheckpointReader& ra,
                   const std::string& b, const ParamLayout& lb, CheckpointReader& rb) {
  const Difference cfg = first_difference(comparable_config(a), comparable_config(b), "");
  const std::string cfg_note =
      cfg.key.empty() ? "" : fmt::format(" (config.json {}: {} vs {})", cfg.key, cfg.a, cfg.b);
  for (const ParamSpec& s : la.specs()) {
    if (s.tied_copy) continue;
    TRELLIS_REQUIRE(lb.has(s.name), "cannot average {} and {}: tensor '{}' is in the first only{}",
                    a, b, s.name, cfg_note);
    const ParamSpec& t = lb.spec(s.name);
    TRELLIS_REQUIRE(s.global_shape == t.global_shape,
                    "cannot average {} and {}: tensor '{}' has shape {} in the first and {} in the "
                    "second{}",
                    a, b, s.name, shape_text(s.global_shape), shape_text(t.global_shape), cfg_note);
  }
  for (const ParamSpec& t : lb.specs())
    TRELLIS_REQUIRE(t.tied_copy || la.has(t.name),
                    "cannot average {} and {}: tensor '{}' is in the second only{}", a, b, t.name,
                    cfg_note);
  TRELLIS_REQUIRE(cfg.key.empty(),
                  "cannot average {} and {}: config.json key {} is {} in the first and {} in the "
                  "second",
                  a, b, cfg.key, cfg.a, cfg.b);
  // The same model: now the same layout, tensor by tensor in the model's order.
  for (const ParamSpec& s : la.specs()) {
    if (s.tied_copy) continue;
    TRELLIS_REQUIRE(ra.has_tensor(s.name) && rb.has_tensor(s.name),
                    "cannot average {} and {}: tensor '{}' is missing from the {}", a, b, s.name,
                    ra.has_tensor(s.name) ? "second" : "first");
    const CheckpointReader::Storage x = ra.storage(s.name), y = rb.storage(s.name);
    if (x == y) continue;
    auto text = [](const CheckpointReader::Storage& st) {
      return fmt::format("{} over tp {} in {} piece{}", shape_text(st.shape), st.tp,
                         st.pieces.size(), st.pieces.size() == 1 ? "" : "s");
    };
    std::string tx = text(x), ty = text(y);
    if (tx == ty) {  // the same count of pieces, held by other ranks or cut elsewhere
      size_t k = 0;
      while (x.pieces[k] == y.pieces[k]) ++k;
      tx += ", one " + x.pieces[k];
      ty += ", one " + y.pieces[k];
    }
    TRELLIS_REQUIRE(false,
                    "cannot average {} and {}: tensor '{}' is stored as {} in the first and {} in "
                    "the second (layouts: {}; {}); average checkpoints saved in one layout",
                    a, b, s.name, tx, ty, layout_text(a), layout_text(b));
  }
  for (const std::string& name : rb.tensor_names())
    TRELLIS_REQUIRE(ra.has_tensor(name),
                    "cannot average {} and {}: tensor '{}' is in the second only", a, b, name);
}

// Files of a checkpoint that are neither its tensors nor its state: config.json, and whatever
// metadata a checkpoint carries beside it (a tokenizer model).
bool metadata_file(const std::string& name) {
  // Hidden files, and what an interrupted write_file_atomic left (NAME.tmp.PID), are not metadata.
  if (name.empty() || name[0] == '.' || name.find(".tmp.") != std::string::npos) return false;
  for (const char* f : {"state.json", "index.json", "model.safetensors", "optimizer.safetensors"})
    if (name == f) return false;
  return name.rfind("shard_", 0) != 0;
}

// rename(2) that never replaces: a directory created at `to` meanwhile is an error, not lost.
void rename_new(const fs::path& from, const fs::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  const int err = errno;
  TRELLIS_REQUIRE(err != EEXIST && err != ENOTEMPTY, "{}: already exists", to.string());
  // File systems without RENAME_NOREPLACE: the check before writing stands.
  TRELLIS_REQUIRE(err == EINVAL || err == ENOSYS, "{}: cannot rename {} into place: {}",
                  to.string(), from.string(), std::strerror(err));
  TRELLIS_REQUIRE(!fs::exists(to), "{}: already exists", to.string());
  fs::rename(from, to);
}

// Where the average goes ("D/" is D), which must not exist yet; and every input a complete
// checkpoint directory.
fs::path check_average_inputs(const std::vector<std::string>& dirs, const std::string& out) {
  TRELLIS_REQUIRE(dirs.size() >= 2, "average needs at least 2 checkpoints (got {})", dirs.size());
  fs::path target(out);
  if (!target.has_filename()) target = target.parent_path();  // "D/"
  TRELLIS_REQUIRE(!target.empty(), "--out is empty");
  TRELLIS_REQUIRE(!fs::exists(fs::symlink_status(target)),
                  "{}: already exists; averaging writes a new checkpoint directory", out);
  for (const std::string& d : dirs) {
    TRELLIS_REQUIRE(fs::is_directory(d), "{}: checkpoint directory not found", d);
    const std::string why = checkpoint_incomplete(d);
    TRELLIS_REQUIRE(why.empty(), "{}: not a complete checkpoint: {}", d, why);
  }
  return target;
}

// Every checkpoint read through the loader (any layout gathered into the whole model), checked
// against the first before any averaging.
std::vector<std::unique_ptr<CheckpointReader>> open_alike(const std::vector<std::string>& dirs,
                                                          const ParamLayout& layout) {
  std::vector<std::unique_ptr<CheckpointReader>> readers;
  readers.push_back(std::make_unique<CheckpointReader>(dirs[0]));
  for (size_t i = 1; i < dirs.size(); ++i) {
    const ParamLayout other(read_model_config((fs::path(dirs[i]) / "config.json").string()));
    readers.push_back(std::make_unique<CheckpointReader>(dirs[i]));
    require_alike(dirs[0], layout, *readers[0], dirs[i], other, *readers[i]);
  }
  return readers;
}

// What state.json records of the inputs: each checkpoint and its step.
json averaged_from(const std::vector<std::string>& dirs) {
  json from = json::array();
  for (const std::string& d : dirs) {
    const std::string path = (fs::path(d) / "state.json").string();
    from.push_back(
        {{"checkpoint", d}, {"step", parse_checkpoint_state(read_file(path), path)["step"]}});
  }
  return from;
}

// One tensor at a time: summed in double over the checkpoints (exact for a handful of fp32 values
// of similar size, so the order does not matter), divided once and rounded to float.
std::vector<float> mean_params(std::vector<std::unique_ptr<CheckpointReader>>& readers,
                               const ParamLayout& layout, AverageResult& result) {
  std::vector<float> avg(layout.size(), 0.0f), part;
  std::vector<double> sum;
  const double n = double(readers.size());
  for (const ParamSpec& s : layout.specs()) {
    if (s.tied_copy) continue;
    part.resize(s.numel());
    sum.assign(s.numel(), 0.0);
    for (auto& r : readers) {
      r->read(layout, {{s.offset, s.offset + s.numel()}}, "params", part.data());
      for (size_t k = 0; k < part.size(); ++k) sum[k] += double(part[k]);
    }
    for (size_t k = 0; k < sum.size(); ++k) avg[s.offset + k] = float(sum[k] / n);
    ++result.tensors;
    result.parameters += int64_t(s.numel());
  }
  return avg;
}

// The average as a single-rank checkpoint in tmp: the first input's metadata files, state.json
// (no optimizer state, data position or RNG), the parameters' shard and the index last.
void write_average(const fs::path& tmp, const std::string& first, const json& from,
                   const ParamLayout& layout, std::vector<float>& avg) {
  for (const auto& e : fs::directory_iterator(first)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && metadata_file(name))
      write_file_atomic((tmp / name).string(), read_file(e.path().string()));
  }
  // No optimizer state, data position or RNG: the result is a starting point for inference or
  // fine-tuning (--init-from), not a run's state to resume.
  const json state = {{"step", from[0]["step"]},
                      {"averaged_from", from},
                      {"averaging", "arithmetic mean per element, summed in double"}};
  // Paths are bytes, not necessarily UTF-8: replaced, not refused (as the trainer's state.json).
  write_file_atomic((tmp / "state.json").string(),
                    state.dump(2, ' ', false, json::error_handler_t::replace));
  OwnedArrays owned;
  owned.ranges = {{0, layout.size()}};
  owned.arrays.emplace_back("params", avg.data());
  write_rank_shard(tmp.string(), 0, layout, owned);
  const json one = {{"world", 1},          {"dp", 1},  {"tp", 1}, {"pp", 1},
                    {"virtual_stages", 1}, {"zero", 0}};
  write_checkpoint_index(tmp.string(), 1, {{"step", state["step"]}, {"layout", one}});
}

}  // namespace

AverageResult average_checkpoints(const std::vector<std::string>& dirs, const std::string& out) {
  const fs::path target = check_average_inputs(dirs, out);
  const ModelConfig model = read_model_config((fs::path(dirs[0]) / "config.json").string());
  const ParamLayout layout(model);
  auto readers = open_alike(dirs, layout);
  const json from = averaged_from(dirs);
  AverageResult result;
  std::vector<float> avg = mean_params(readers, layout, result);
  readers.clear();

  // Published as training publishes a checkpoint: written under a temporary name beside the
  // target, its index last, then renamed into place.
  const fs::path tmp = target.parent_path() / fmt::format(".{}.tmp.{}", target.filename().string(),
                                                          static_cast<long>(::getpid()));
  try {
    if (target.has_parent_path()) fs::create_directories(target.parent_path());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    write_average(tmp, dirs[0], from, layout, avg);
    rename_new(tmp, target);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    TRELLIS_REQUIRE(false, "{}: cannot write: {}", out, e.what());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  result.out = target.string();
  return result;
}

}  // namespace trellis
