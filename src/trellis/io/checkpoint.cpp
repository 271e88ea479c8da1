#include "trellis/io/checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <type_traits>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/data/tokenizer.h"
#include "trellis/io/safetensors.h"
#include "trellis/io/sharded_checkpoint.h"
#include "trellis/model/family.h"

namespace fs = std::filesystem;

namespace trellis {

namespace {

// Rows written for a parameter: embeddings and heads keep only the true vocabulary (padding is
// ours, not HF's).
int64_t export_rows(const ParamSpec& s) { return s.export_rows >= 0 ? s.export_rows : s.shape[0]; }

std::vector<TensorRef> tensor_refs(const ParamLayout& layout, const float* flat,
                                   const std::string& prefix) {
  std::vector<TensorRef> refs;
  for (const auto& s : layout.specs()) {
    TensorRef r;
    r.name = prefix + s.name;
    r.shape = s.shape;
    r.shape[0] = export_rows(s);
    r.data = flat + s.offset;
    refs.push_back(r);
  }
  return refs;
}

// Fills `flat` from the file; every parameter must be present with the exported shape.
void read_tensors(const SafetensorsFile& f, const std::string& path, const ParamLayout& layout,
                  const std::string& prefix, float* flat) {
  for (const auto& s : layout.specs()) {
    const std::string name = prefix + s.name;
    TRELLIS_REQUIRE(f.has(name), "{}: missing tensor '{}'", path, name);
    std::vector<int64_t> want = s.shape;
    want[0] = export_rows(s);
    TRELLIS_REQUIRE(f.shape(name) == want, "{}: tensor '{}' has shape [{}], expected [{}]", path,
                    name, fmt::join(f.shape(name), ", "), fmt::join(want, ", "));
    const size_t n = size_t(want[0]) * (s.numel() / size_t(s.shape[0]));
    std::copy_n(f.data(name), n, flat + s.offset);
    std::fill(flat + s.offset + n, flat + s.offset + s.numel(), 0.0f);
  }
}

// Hugging Face config.json of the model's family, plus a "trellis" section with what HF's config
// does not say (tokenizer, vocabulary padding; the family, for people: model_type decides).
// The family's config.json; a classifier is its family's *ForSequenceClassification.
nlohmann::json hf_model_config(const ModelConfig& m) {
  nlohmann::json j = family_of(m.arch).to_hf_config(m);
  if (m.num_classes == 0 || !j.contains("architectures")) return j;
  for (auto& name : j["architectures"]) {
    const std::string a = name.get<std::string>();
    for (const char* lm : {"LMHeadModel", "ForCausalLM"})
      if (const size_t at = a.find(lm); at != std::string::npos)
        name = a.substr(0, at) + "ForSequenceClassification";
  }
  return j;
}

nlohmann::json hf_config(const ModelConfig& m, const TokenizerInfo& tok,
                         const nlohmann::json& task) {
  nlohmann::json j = hf_model_config(m);
  if (tok.kind == "gpt2") j["bos_token_id"] = j["eos_token_id"] = 50256;
  j["torch_dtype"] = "float32";
  j["trellis"] = {{"arch", m.arch},
                  {"tokenizer", tok.kind},
                  {"tokenizer_dir", tok.dir},
                  {"vocab_multiple", m.vocab_multiple},
                  {"blocks", block_choices(m)}};
  if (tok.vocab > 0) j["trellis"]["tokenizer_vocab"] = tok.vocab;
  if (m.bf16_embeddings) j["trellis"]["bf16_embeddings"] = true;
  if (!task.is_null()) j["trellis"]["task"] = task;
  if (task.contains("classes")) {  // Hugging Face's names for a sequence classifier's labels
    j["num_labels"] = task["classes"].size();
    for (size_t i = 0; i < task["classes"].size(); ++i) {
      j["id2label"][std::to_string(i)] = task["classes"][i];
      j["label2id"][task["classes"][i].get<std::string>()] = i;
    }
  }
  return j;
}

template <class T>
T json_get(const nlohmann::json& j, const char* key, const std::string& path) {
  TRELLIS_REQUIRE(j.contains(key), "{}: missing key '{}'", path, key);
  // nlohmann converts a float to an integer type by a cast, undefined beyond the type's range
  // (found by fuzzing: 6e56 as an int64).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    TRELLIS_REQUIRE(j.at(key).is_number_integer(), "{}: key '{}' must be an integer", path, key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    TRELLIS_REQUIRE(false, "{}: key '{}' has the wrong type", path, key);
  }
  return T{};
}

// Paths and config values are bytes, not necessarily UTF-8, and dump() throws on invalid UTF-8;
// a checkpoint is still written (those bytes become U+FFFD), not lost at the end of a run.
std::string dump_json(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json parse_json(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TRELLIS_REQUIRE(false, "{}: invalid JSON: {}", path, e.what());
  }
  return {};
}


// The model a config.json describes (see read_model_config).
ModelConfig model_config_from_json(const nlohmann::json& cfg, const std::string& cfg_path) {
  const Family& fam = family_of_hf_config(cfg, cfg_path);
  ModelConfig m;
  m.arch = fam.arch;
  fam.configure(m);
  fam.from_hf_config(HfConfigReader(cfg, cfg_path), m);
  if (cfg.contains("trellis")) {
    const auto& t = cfg["trellis"];
    const int64_t multiple = json_get<int64_t>(t, "vocab_multiple", cfg_path);
    TRELLIS_REQUIRE(multiple >= 1 && multiple <= kMaxVocab,
                    "{}: key 'trellis.vocab_multiple' is {}; it must be between 1 and {}", cfg_path,
                    multiple, kMaxVocab);
    m.vocab_multiple = int(multiple);
    if (t.contains("bf16_embeddings"))
      m.bf16_embeddings = json_get<bool>(t, "bf16_embeddings", cfg_path);
    if (t.contains("blocks")) {
      set_block_choices(t["blocks"], m, cfg_path + " trellis.blocks");
      // trellis wrote both parts: they must still describe the same model.
      const nlohmann::json described = hf_model_config(m);
      for (const auto& [key, value] : described.items())
        TRELLIS_REQUIRE(!cfg.contains(key) || cfg[key] == value,
                        "{}: {} is {}, but its trellis section describes {}", cfg_path, key,
                        cfg[key].dump(), value.dump());
    }
  }
  int64_t count = 0;
  try {
    m.validate();
    count = ParamLayout(m).count();  // the family's own shape rules
  } catch (const Error& e) {
    TRELLIS_REQUIRE(false, "{}: {}", cfg_path, e.what());
  }
  // Each size is bounded, so the count cannot overflow; their product still can be absurd.
  TRELLIS_REQUIRE(count <= kMaxParams,
                  "{}: the sizes describe a model of {} parameters (at most {})", cfg_path, count,
                  kMaxParams);
  return m;
}

// state.json's step (where a resumed run starts). An unsigned value above int64's range is
// refused before get<int64_t>() could wrap it.
int64_t json_step(const nlohmann::json& state, const std::string& path) {
  TRELLIS_REQUIRE(state.is_object(), "{}: not a JSON object", path);
  TRELLIS_REQUIRE(state.contains("step"), "{}: missing key 'step'", path);
  const nlohmann::json& v = state["step"];
  TRELLIS_REQUIRE(v.is_number_integer() &&
                      !(v.is_number_unsigned() &&
                        v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) &&
                      v.get<int64_t>() >= 0,
                  "{}: key 'step' must be a non-negative integer (got {})", path, v.dump());
  return v.get<int64_t>();
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  return parse_json(read_file(path), path);
}

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::string save_checkpoint(const std::string& out_dir, int64_t step, const CheckpointData& ck) {
  const ParamLayout layout(ck.model);
  const fs::path final_dir = fs::path(out_dir) / checkpoint_dir_name(step);
  const fs::path tmp_dir = fs::path(out_dir) / ("." + checkpoint_dir_name(step) + ".tmp");
  fs::create_directories(out_dir);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  write_safetensors((tmp_dir / "model.safetensors").string(),
                    tensor_refs(layout, ck.params.data(), ""), {{"format", "pt"}});
  write_file_atomic((tmp_dir / "config.json").string(),
                    dump_json(hf_config(ck.model, ck.tokenizer, ck.task)));
  if (!ck.optimizer.buffers.empty()) {
    std::vector<TensorRef> refs;
    for (const auto& [name, buf] : ck.optimizer.buffers) {
      auto r = tensor_refs(layout, buf.data(), name + ".");
      refs.insert(refs.end(), r.begin(), r.end());
    }
    write_safetensors((tmp_dir / "optimizer.safetensors").string(), refs, {{"format", "pt"}});
  }
  write_file_atomic((tmp_dir / "state.json").string(), dump_json(ck.state));
  if (!ck.tokenizer.model.empty())
    write_file_atomic((tmp_dir / kSentencePieceFile).string(), ck.tokenizer.model);
  // Replace an older copy of the same step only once the new one is complete.
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
  return final_dir.string();
}

std::string find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped) {
  if (!fs::is_directory(out_dir)) return {};
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0) found.push_back(e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  for (const std::string& dir : found) {
    const std::string why = checkpoint_incomplete(dir);
    if (why.empty()) return dir;
    if (skipped) skipped->push_back(why);
  }
  return {};
}

std::string checkpoint_config_json(const ModelConfig& model, const TokenizerInfo& tokenizer,
                                   const nlohmann::json& task) {
  return dump_json(hf_config(model, tokenizer, task));
}

ModelConfig read_model_config(const std::string& config_path) {
  return model_config_from_json(read_json_file(config_path), config_path);
}

ModelConfig parse_model_config(const std::string& text, const std::string& path) {
  return model_config_from_json(parse_json(text, path), path);
}

nlohmann::json parse_checkpoint_state(const std::string& text, const std::string& path) {
  nlohmann::json state = parse_json(text, path);
  json_step(state, path);
  return state;
}

CheckpointData load_checkpoint_config(const std::string& dir) {
  TRELLIS_REQUIRE(fs::is_directory(dir), "{}: checkpoint directory not found", dir);
  CheckpointData ck;
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const nlohmann::json cfg = read_json_file(cfg_path);
  ck.model = model_config_from_json(cfg, cfg_path);
  if (cfg.contains("trellis")) {
    const auto& t = cfg["trellis"];
    ck.tokenizer.kind = json_get<std::string>(t, "tokenizer", cfg_path);
    ck.tokenizer.dir = json_get<std::string>(t, "tokenizer_dir", cfg_path);
    // Its tokenizer.model is the checkpoint's own (an export's too), wherever the data was.
    if (ck.tokenizer.kind == "sentencepiece") ck.tokenizer.dir = dir;
    if (t.contains("tokenizer_vocab")) {
      const int64_t v = json_get<int64_t>(t, "tokenizer_vocab", cfg_path);
      TRELLIS_REQUIRE(v >= 1 && v <= kMaxVocab,
                      "{}: key 'trellis.tokenizer_vocab' is {}; it must be between 1 and {}",
                      cfg_path, v, kMaxVocab);
      ck.tokenizer.vocab = int(v);
    }
    if (t.contains("task")) ck.task = t["task"];
  } else {
    // A plain Hugging Face checkpoint.
    ck.tokenizer.kind = ck.model.vocab_size == 50257 ? "gpt2" : "byte";
  }
  return ck;
}

CheckpointData load_checkpoint(const std::string& dir, bool with_optimizer) {
  CheckpointData ck = load_checkpoint_config(dir);
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const ParamLayout layout(ck.model);
  if (is_sharded_checkpoint(dir)) {
    // The whole model (tp = 1, every stage) from the shards, one state at a time.
    CheckpointReader reader(dir);
    // Before allocating what config.json describes: the shards must be able to fill it.
    TRELLIS_REQUIRE(reader.saved_elements() >= layout.count(),
                    "{}/index.json: {} elements per state cannot hold the {} parameters that {} "
                    "describes",
                    dir, reader.saved_elements(), layout.count(), cfg_path);
    ck.params.assign(layout.size(), 0.0f);
    reader.read(layout, {{0, layout.size()}}, "params", ck.params.data());
    if (!with_optimizer) return ck;
    const std::string state_path = (fs::path(dir) / "state.json").string();
    ck.state = parse_checkpoint_state(read_file(state_path), state_path);
    for (const std::string& s : reader.states()) {
      if (s == "params") continue;
      std::vector<float> buf(layout.size(), 0.0f);
      reader.read(layout, {{0, layout.size()}}, s, buf.data());
      ck.optimizer.buffers.emplace_back(s, std::move(buf));
    }
    return ck;
  }
  const std::string model_path = (fs::path(dir) / "model.safetensors").string();
  // Before allocating what config.json describes: the weights must be there to fill it.
  std::error_code ec;
  const uintmax_t file_bytes = fs::file_size(model_path, ec);
  TRELLIS_REQUIRE(ec || file_bytes >= uintmax_t(layout.count()) * 4,
                  "{}: {} bytes cannot hold the {} parameters (float32) that {} describes",
                  model_path, file_bytes, layout.count(), cfg_path);
  ck.params.assign(layout.size(), 0.0f);
  read_tensors(SafetensorsFile(model_path), model_path, layout, "", ck.params.data());
  if (!with_optimizer) return ck;
  const std::string state_path = (fs::path(dir) / "state.json").string();
  ck.state = parse_checkpoint_state(read_file(state_path), state_path);
  const std::string opt_path = (fs::path(dir) / "optimizer.safetensors").string();
  if (fs::exists(opt_path)) {
    SafetensorsFile f(opt_path);
    std::vector<std::string> prefixes;
    for (const auto& n : f.names()) {
      const std::string p = n.substr(0, n.find('.'));
      if (std::find(prefixes.begin(), prefixes.end(), p) == prefixes.end()) prefixes.push_back(p);
    }
    for (const auto& p : prefixes) {
      std::vector<float> buf(layout.size(), 0.0f);
      read_tensors(f, opt_path, layout, p + ".", buf.data());
      ck.optimizer.buffers.emplace_back(p, std::move(buf));
    }
  }
  return ck;
}

std::unique_ptr<Tokenizer> load_checkpoint_tokenizer(const CheckpointData& ck,
                                                     const std::string& dir) {
  const TokenizerInfo& info = ck.tokenizer;
  TRELLIS_REQUIRE(info.kind != "none", "the checkpoint's model reads images, not text");
  const std::string from = dir.empty() ? info.dir : dir;
  auto tok = make_tokenizer(info.kind, from);
  if (info.kind == "byte") return tok;  // plain Hugging Face checkpoints are taken as bytes
  const std::string file =
      (fs::path(from) / (info.kind == "sentencepiece" ? kSentencePieceFile : "encoder.json"))
          .string();
  const int special = ck.task.is_object() ? ck.task.value("special_token", -1) : -1;
  const int needed = std::max(tok->vocab_size(), special + 1);
  TRELLIS_REQUIRE(info.vocab == 0 || tok->vocab_size() == info.vocab,
                  "{}: the tokenizer has {} tokens, but the checkpoint's model was trained with "
                  "one of {} (config.json's trellis.tokenizer_vocab)",
                  file, tok->vocab_size(), info.vocab);
  TRELLIS_REQUIRE(needed <= ck.model.vocab_size,
                  "{}: the tokenizer needs {} token ids, more than the checkpoint's vocabulary of "
                  "{} (config.json's vocab_size)",
                  file, needed, ck.model.vocab_size);
  return tok;
}

}  // namespace trellis
