#include "trellis/io/pretrained.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/io/checkpoint.h"
#include "trellis/io/safetensors.h"
#include "trellis/io/sharded_checkpoint.h"

namespace fs = std::filesystem;

namespace trellis {

namespace {

// A tensor the task adds on top of a pretrained body, which DIR may lack: a sequence classifier's
// head (score.weight of gpt2 and llama, classifier.weight/.bias of the encoder).
bool is_task_head(const ParamSpec& s) { return s.slot == Slot::Classifier; }

// Buffers that Hugging Face models save next to their weights but trellis computes: GPT-2's
// causal mask (attn.bias) and its masked_bias constant, LLaMA's rotary inverse frequencies.
bool is_buffer(const std::string& name) {
  static const std::regex buffers(R"((.*\.)?attn\.(bias|masked_bias)|(.*\.)?rotary_emb\.inv_freq)");
  return std::regex_match(name, buffers);
}

// Where each tensor of DIR lives: model.safetensors, or the shards a
// model.safetensors.index.json's weight_map names.
struct TensorFiles {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::vector<std::string> paths;
  std::map<std::string, size_t> file_of;  // tensor name in DIR -> index into files
};

// A Hugging Face directory holds its weights in one model.safetensors or in shards listed by
// model.safetensors.index.json.
void require_weight_files(const std::string& dir) {
  TRELLIS_REQUIRE(fs::exists(fs::path(dir) / "model.safetensors") ||
                      fs::exists(fs::path(dir) / "model.safetensors.index.json") ||
                      is_sharded_checkpoint(dir),
                  "{}: no model.safetensors or model.safetensors.index.json", dir);
}

TensorFiles open_tensor_files(const std::string& dir) {
  TensorFiles t;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;
  require_weight_files(dir);
  if (fs::exists(single)) {
    shards.push_back(single.string());
  } else {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index.string()));
    } catch (const nlohmann::json::exception& e) {
      TRELLIS_REQUIRE(false, "{}: invalid JSON: {}", index.string(), e.what());
    }
    TRELLIS_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                    "{}: no \"weight_map\" object", index.string());
    for (const auto& [name, file] : j["weight_map"].items()) {
      TRELLIS_REQUIRE(file.is_string(), "{}: weight_map entry of '{}' is not a file name",
                      index.string(), name);
      const std::string f = file.get<std::string>();
      // Shards are files next to the index, never elsewhere on the machine.
      const fs::path rel(f);
      TRELLIS_REQUIRE(
          !f.empty() && rel.is_relative() && std::find(rel.begin(), rel.end(), "..") == rel.end(),
          "{}: weight_map names '{}' for '{}', which is not a file in {}", index.string(), f, name,
          dir);
      weight_map[name] = (fs::path(dir) / rel).string();
      if (std::find(shards.begin(), shards.end(), weight_map[name]) == shards.end())
        shards.push_back(weight_map[name]);
    }
  }
  for (const std::string& path : shards) {
    t.paths.push_back(path);
    t.files.push_back(std::make_unique<SafetensorsFile>(path));
    for (const std::string& name : t.files.back()->names()) {
      auto [it, fresh] = t.file_of.emplace(name, t.files.size() - 1);
      TRELLIS_REQUIRE(fresh, "{}: tensor '{}' is in both {} and {}", dir, name, t.paths[it->second],
                      path);
    }
  }
  for (const auto& [name, path] : weight_map) {
    auto it = t.file_of.find(name);
    TRELLIS_REQUIRE(it != t.file_of.end() && t.paths[it->second] == path,
                    "{}: the index puts tensor '{}' in {}, which does not hold it", index.string(),
                    name, path);
  }
  return t;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

ModelConfig pretrained_model_config(const std::string& dir) {
  TRELLIS_REQUIRE(fs::is_directory(dir), "{}: --init-from directory not found", dir);
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const ModelConfig m = read_model_config(cfg_path);
  require_weight_files(dir);
  // The model is allocated before its tensors are read: sizes the weights on disk cannot fill
  // (at two bytes a value, F16/BF16) are refused here, not by running out of memory.
  int64_t values = 0;
  const ParamLayout layout(m);
  for (const ParamSpec& s : layout.specs())
    if (!s.tied_copy && !is_task_head(s))
      values += int64_t(s.numel()) / s.shape[0] * (s.export_rows >= 0 ? s.export_rows : s.shape[0]);
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::error_code ec;
    const uintmax_t n = e.file_size(ec);
    if (!ec) bytes += n;
  }
  TRELLIS_REQUIRE(bytes >= uintmax_t(values) * 2,
                  "{}: its .safetensors files ({} bytes) cannot hold the {} parameters that {} "
                  "describes",
                  dir, bytes, values, cfg_path);
  return m;
}

namespace {

// A trellis training checkpoint (any layout): its tensors by name, the true vocabulary rows.
PretrainedReport load_trellis_checkpoint(const std::string& dir, const ParamLayout& global,
                                         float* params) {
  CheckpointReader reader(dir);
  for (const std::string& name : reader.tensor_names())
    TRELLIS_REQUIRE(global.has(name),
                    "{}: tensor '{}' is not part of the configured {} model (another "
                    "architecture or block choice than its config.json says?)",
                    dir, name, global.config().arch);
  PretrainedReport report;
  for (const ParamSpec& s : global.specs()) {
    if (s.tied_copy) continue;
    if (!reader.has_tensor(s.name)) {
      TRELLIS_REQUIRE(is_task_head(s), "{}: missing tensor '{}' (the model needs it)", dir,
                      s.name);
      report.initialised.push_back(s.name);
      continue;
    }
    const size_t rows = size_t(s.export_rows >= 0 ? s.export_rows : s.shape[0]);
    const size_t n = s.numel() / size_t(s.shape[0]) * rows;
    reader.read(global, {{s.offset, s.offset + n}}, "params", params + s.offset);
    report.loaded.push_back(s.name);
  }
  return report;
}

// Which tensor of a Hugging Face directory each model tensor comes from.
struct SourceNames {
  std::map<std::string, std::string> source;  // model name -> name in DIR
  std::vector<std::string> tied_lm_head;      // lm_head.weight of DIR when the model ties it
};

SourceNames match_source_names(const std::string& dir, const TensorFiles& files,
                               const ParamLayout& global) {
  const bool gpt2 = global.config().arch == std::string("gpt2");
  const bool classifier = std::any_of(global.specs().begin(), global.specs().end(), is_task_head);
  // GPT2LMHeadModel saves "transformer.h.0..." in some versions of transformers and "h.0..." in
  // others.
  SourceNames m;
  for (const auto& [name, file] : files.file_of) {
    std::string as = name;
    if (gpt2 && as.rfind("transformer.", 0) == 0)
      as = as.substr(std::string("transformer.").size());
    if (global.has(as)) {
      auto [it, fresh] = m.source.emplace(as, name);
      TRELLIS_REQUIRE(fresh, "{}: tensors '{}' and '{}' are both {}", dir, it->second, name, as);
      continue;
    }
    if (is_buffer(as)) continue;
    if (as == "lm_head.weight" && (classifier || global.config().tied_head)) {
      // A classifier replaces the language-model head; a tied head is the embedding.
      if (!classifier) m.tied_lm_head.push_back(name);
      continue;
    }
    TRELLIS_REQUIRE(false,
                    "{}: tensor '{}' is not part of the configured {} model (another architecture "
                    "or block choice than its config.json says?)",
                    dir, name, global.config().arch);
  }
  return m;
}

// Every model tensor from its source, shapes checked; a missing task head stays as initialised.
PretrainedReport copy_sources(const std::string& dir, const TensorFiles& files,
                              const SourceNames& m, const ParamLayout& global, float* params) {
  PretrainedReport report;
  for (const ParamSpec& s : global.specs()) {
    if (s.tied_copy) continue;
    auto it = m.source.find(s.name);
    if (it == m.source.end()) {
      TRELLIS_REQUIRE(is_task_head(s), "{}: missing tensor '{}' (the model needs it)", dir, s.name);
      report.initialised.push_back(s.name);
      continue;
    }
    const SafetensorsFile& f = *files.files[files.file_of.at(it->second)];
    std::vector<int64_t> want = s.shape;
    want[0] = s.export_rows >= 0 ? s.export_rows : s.shape[0];
    TRELLIS_REQUIRE(f.shape(it->second) == want,
                    "{}: tensor {} has shape {} in the checkpoint, the model needs {}", dir,
                    it->second, shape_str(f.shape(it->second)), shape_str(want));
    const std::vector<float> values = f.floats(it->second);
    // Rows past export_rows (the padded vocabulary) keep their values.
    std::copy(values.begin(), values.end(), params + s.offset);
    report.loaded.push_back(s.name);
  }
  return report;
}

// A tied head is the embedding; a saved copy must be that same tensor, or the checkpoint was
// trained with an untied head that this model would silently drop.
void require_tied_heads_equal(const std::string& dir, const TensorFiles& files,
                              const SourceNames& m, const ParamLayout& global) {
  for (const std::string& name : m.tied_lm_head) {
    const ParamSpec* emb = global.find(Slot::TokEmbed, -1);
    TRELLIS_CHECK(emb != nullptr, "a tied head without a token embedding");
    const SafetensorsFile& f = *files.files[files.file_of.at(name)];
    const auto& emb_name = m.source.at(emb->name);
    const SafetensorsFile& fe = *files.files[files.file_of.at(emb_name)];
    TRELLIS_REQUIRE(f.shape(name) == fe.shape(emb_name) && f.floats(name) == fe.floats(emb_name),
                    "{}: {} differs from {}, but the model ties its head to the embedding "
                    "(config.json: tie_word_embeddings); set it to false to keep the head",
                    dir, name, emb_name);
  }
}

}  // namespace

PretrainedReport load_pretrained(const std::string& dir, const ParamLayout& global, float* params) {
  TRELLIS_CHECK(global.tp() == 1, "load_pretrained needs the tp = 1 layout");
  TRELLIS_REQUIRE(fs::is_directory(dir), "{}: --init-from directory not found", dir);
  if (is_sharded_checkpoint(dir)) return load_trellis_checkpoint(dir, global, params);
  const TensorFiles files = open_tensor_files(dir);
  const SourceNames sources = match_source_names(dir, files, global);
  PretrainedReport report = copy_sources(dir, files, sources, global, params);
  require_tied_heads_equal(dir, files, sources, global);
  return report;
}

}  // namespace trellis
