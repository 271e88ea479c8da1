#include "trellis/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>

#include "trellis/core/error.h"
#include "trellis/data/shard.h"
#include "trellis/data/tokenizer.h"
#include "trellis/io/atomic_file.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

// Inputs in a fixed order (directories sorted by name) so the same inputs always give the same
// token stream, whatever order the file system lists them in.
std::vector<std::string> collect_input_files(const std::vector<std::string>& inputs) {
  TRELLIS_REQUIRE(!inputs.empty(), "prepare: no input files given");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    const auto st = fs::status(in, ec);
    TRELLIS_REQUIRE(fs::exists(st), "{}: input not found", in);
    if (fs::is_directory(st)) {
      std::vector<std::string> inside;
      for (fs::directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file()) inside.push_back(it->path().string());
      TRELLIS_REQUIRE(!ec, "{}: cannot list input directory: {}", in, ec.message());
      TRELLIS_REQUIRE(!inside.empty(), "{}: input directory holds no regular files", in);
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else {
      TRELLIS_REQUIRE(fs::is_regular_file(st), "{}: input is not a regular file or directory", in);
      files.push_back(in);
    }
  }
  return files;
}

void write_split(const std::string& out_dir, const std::string& prefix, const uint32_t* tokens,
                 size_t n, size_t shard_tokens, int32_t version,
                 std::vector<std::string>& written) {
  size_t shard = 0;
  for (size_t begin = 0; begin < n; begin += shard_tokens, ++shard) {
    const size_t end = std::min(n, begin + shard_tokens);
    const std::string name = fmt::format("{}_{:06d}.bin", prefix, shard);
    write_shard((fs::path(out_dir) / name).string(),
                std::span<const uint32_t>(tokens + begin, end - begin), version);
    written.push_back(name);
  }
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& opt) {
  TRELLIS_REQUIRE(!opt.out_dir.empty(), "prepare: no output directory given");
  TRELLIS_REQUIRE(opt.val_fraction > 0.0 && opt.val_fraction < 1.0,
                  "prepare: val_fraction must be in (0, 1), got {}", opt.val_fraction);
  TRELLIS_REQUIRE(opt.shard_tokens > 0, "prepare: shard_tokens must be positive");
  const auto files = collect_input_files(opt.inputs);
  const auto tok = make_tokenizer(opt.tokenizer, opt.tokenizer_dir);
  // uint16 shards (llm.c's version 1) where the vocabulary fits, uint32 (version 2) beyond.
  const int32_t version = shard_version_for_vocab(tok->vocab_size());

  std::vector<uint32_t> tokens;
  bool first_doc = true;
  for (const auto& f : files) {
    const std::string text = read_file(f);
    if (text.empty()) continue;
    // A separator between documents tells the model where one text ends and the next begins.
    if (!first_doc && tok->eot_token() >= 0)
      tokens.push_back(static_cast<uint32_t>(tok->eot_token()));
    first_doc = false;
    for (int t : tok->encode(text)) tokens.push_back(static_cast<uint32_t>(t));
  }
  TRELLIS_REQUIRE(!tokens.empty(), "prepare: empty corpus: the {} input file(s) hold no text",
                  files.size());
  TRELLIS_REQUIRE(tokens.size() >= 2,
                  "prepare: corpus too small: {} token; need at least 2 (one for training, one "
                  "for validation)",
                  tokens.size());
  const size_t total = tokens.size();
  auto n_val = static_cast<size_t>(std::llround(static_cast<double>(total) * opt.val_fraction));
  n_val = std::clamp<size_t>(n_val, 1, total - 1);
  const size_t n_train = total - n_val;

  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  TRELLIS_REQUIRE(!ec, "{}: cannot create output directory: {}", opt.out_dir, ec.message());
  std::vector<std::string> written;
  write_split(opt.out_dir, "train", tokens.data(), n_train, opt.shard_tokens, version, written);
  write_split(opt.out_dir, "val", tokens.data() + n_train, n_val, opt.shard_tokens, version,
              written);

  nlohmann::json meta;
  meta["tokenizer"] = tok->kind();
  // Absolute, so the data directory stays usable from any working directory.
  meta["tokenizer_dir"] =
      opt.tokenizer_dir.empty() ? std::string() : fs::absolute(opt.tokenizer_dir).string();
  meta["vocab_size"] = tok->vocab_size();
  meta["train_tokens"] = n_train;
  meta["val_tokens"] = n_val;
  write_file_atomic((fs::path(opt.out_dir) / "meta.json").string(), meta.dump(2) + "\n");

  // Shards left over from an earlier, larger prepare into the same directory would be picked up
  // by load_corpus_dir and silently mix two corpora; remove exactly those we did not rewrite.
  static const std::regex shard_name(R"((train|val)_\d{6}\.bin)");
  for (const auto& e : fs::directory_iterator(opt.out_dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, shard_name) &&
        std::find(written.begin(), written.end(), name) == written.end())
      fs::remove(e.path());
  }
  return PrepareResult{n_train, n_val};
}

}  // namespace trellis
