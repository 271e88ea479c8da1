// `trellis tokenize`: the token ids of each line of a text file, one JSON array per line, with the
// tokenizer a checkpoint or a data directory holds (byte, GPT-2 BPE or SentencePiece); with
// --decode, the text of each line's ids.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/data/corpus.h"
#include "trellis/data/examples.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/data/tokenizer.h"
#include "trellis/io/checkpoint.h"

namespace trellis {

namespace {

struct TokenizeArgs {
  std::string checkpoint, data, input;
  bool decode = false;
};

// One line of `tokenize --decode`'s input: a JSON array of token ids.
std::vector<int> parse_ids(const std::string& line, const std::string& where) {
  const auto j = nlohmann::json::parse(line, nullptr, false);
  TRELLIS_REQUIRE(j.is_array(), "{}: expected a JSON array of token ids", where);
  std::vector<int> ids;
  for (const auto& v : j) {
    TRELLIS_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 30),
                    "{}: {} is not a token id", where, v.dump());
    ids.push_back(v.get<int>());
  }
  return ids;
}

// A data directory's tokenizer (a task directory's or a token-shard directory's), checked
// against the vocabulary its meta.json records.
std::unique_ptr<Tokenizer> data_tokenizer(const std::string& dir) {
  std::string kind, tokenizer_dir;
  SpecialToken want;
  if (is_task_dir(dir)) {
    const TaskMeta meta = read_task_meta(dir);
    kind = meta.tokenizer;
    tokenizer_dir = meta.tokenizer_dir;
    want = {meta.special_token, meta.vocab_size};
  } else {
    const Corpus c = load_corpus_dir(dir);
    kind = c.tokenizer;
    tokenizer_dir = c.tokenizer_dir;
    want = {-1, c.vocab_size};
  }
  TRELLIS_REQUIRE(kind != "none", "{}: holds images, which have no tokenizer", dir);
  auto tok = make_tokenizer(kind, tokenizer_dir);
  if (kind == "sentencepiece") {
    const SpecialToken got =
        want.id >= 0 ? task_special_token(*tok) : SpecialToken{-1, tok->vocab_size()};
    TRELLIS_REQUIRE(got.id == want.id && got.vocab_size == want.vocab_size,
                    "{}/{}: a model of {} pieces, but {}/meta.json says vocab_size {}", dir,
                    kSentencePieceFile, tok->vocab_size(), dir, want.vocab_size);
  }
  return tok;
}

int run_tokenize(const TokenizeArgs& a) {
  TRELLIS_REQUIRE(a.checkpoint.empty() != a.data.empty(),
                  "tokenize: give --checkpoint DIR or --data DIR (the tokenizer's owner)");
  const auto tok = a.checkpoint.empty()
                       ? data_tokenizer(a.data)
                       : load_checkpoint_tokenizer(load_checkpoint_config(a.checkpoint));
  std::ifstream file;
  if (a.input != "-") {
    file.open(a.input, std::ios::binary);
    TRELLIS_REQUIRE(file.good(), "{}: cannot open", a.input);
  }
  std::istream& in = a.input == "-" ? std::cin : file;
  // Lines as `translate` and `classify` read them: a final newline ends the last one, \r\n too.
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (a.decode)
      fmt::print("{}\n", tok->decode(parse_ids(line, fmt::format("{}:{}", a.input, n))));
    else
      fmt::print("[{}]\n", fmt::join(tok->encode(line), ", "));
  }
  TRELLIS_REQUIRE(in.eof(), "{}: read failed", a.input);
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "print the token ids of each line of a text file (a JSON array per line) with the "
      "tokenizer of a checkpoint or a data directory");
  auto* ck = sub->add_option("--checkpoint", a->checkpoint,
                             "checkpoint (or exported) directory whose tokenizer to use");
  auto* data = sub->add_option("--data", a->data,
                               "data directory from `trellis prepare` whose tokenizer to use");
  ck->excludes(data);
  sub->add_option("--input", a->input, "text file, one text per line (- = standard input)")
      ->required();
  sub->add_flag("--decode", a->decode,
                "the other way: each input line a JSON array of ids, printed as its text");
  return {sub, [a](Communicator& world) { return world.rank() == 0 ? run_tokenize(*a) : 0; }};
}

}  // namespace trellis
