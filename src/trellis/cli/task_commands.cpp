// `trellis classify` (a classifier's label and class probabilities for each input line) and
// `trellis translate` (an encoder-decoder's translation of each input line).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trellis/cli/commands.h"
#include "trellis/cli/ensemble.h"
#include "trellis/cli/local_model.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/data/tokenizer.h"
#include "trellis/io/checkpoint.h"
#include "trellis/model/decode.h"
#include "trellis/train/batches.h"

namespace trellis {

namespace {

struct TaskArgs {
  std::vector<std::string> checkpoints;  // classify: several are an ensemble
  std::string input, tokenizer_dir;
  int64_t batch_size = 32, max_len = 0;
  int beam = 1, threads = 0;
  bool no_cache = false;
};

// The input's lines (a final newline ends the last one; \r\n is accepted).
std::vector<std::string> read_input_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TRELLIS_REQUIRE(in.good(), "{}: cannot open", path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

// The checkpoint of a `task` model, its sequence layout, and its tokenizer.
struct TaskModel {
  CheckpointData ck;
  SequenceFormat format;
  std::unique_ptr<Tokenizer> tokenizer;
};

TaskModel load_task_model(const TaskArgs& a, const std::string& checkpoint,
                          const std::string& task) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  TaskModel m;
  m.ck = load_checkpoint(checkpoint, false);
  TRELLIS_REQUIRE(m.ck.task.value("task", std::string("lm")) == task,
                  "{}: not a {} checkpoint (it was trained for {})", checkpoint,
                  task == "classify" ? "classification" : "translation",
                  m.ck.task.value("task", std::string("language modelling")));
  TaskMeta meta;
  meta.task = task;
  meta.special_token = m.ck.task.at("special_token").get<int>();
  meta.feature_dim = m.ck.task.value("feature_dim", 0);
  TRELLIS_REQUIRE(meta.feature_dim == 0,
                  "{}: an image classifier; evaluate it with `trellis eval --data DIR`",
                  checkpoint);
  m.format = SequenceFormat(meta, m.ck.task.at("seq_len").get<int64_t>());
  m.tokenizer = load_checkpoint_tokenizer(m.ck, a.tokenizer_dir);
  return m;
}

std::vector<uint32_t> encode(const Tokenizer& tok, const std::string& text) {
  const std::vector<int> ids = tok.encode(text);
  return {ids.begin(), ids.end()};
}

void add_common_options(CLI::App* sub, TaskArgs& a, bool ensemble) {
  sub->add_option("--checkpoint", a.checkpoints,
                  ensemble ? "checkpoint directory; several classifiers of the same classes (or "
                             "the out directory of a run with ensemble > 1) label as an ensemble, "
                             "the mean of their class probabilities"
                           : "checkpoint directory")
      ->required()
      ->expected(1, ensemble ? 1 << 16 : 1);
  sub->add_option("--input", a.input, "text file, one input per line")->required();
  sub->add_option("--batch-size", a.batch_size, "inputs run together")->capture_default_str();
  sub->add_option("--tokenizer-dir", a.tokenizer_dir,
                  "tokenizer directory (GPT-2's files or a tokenizer.model; default: the "
                  "checkpoint's)");
  sub->add_option("--threads", a.threads, "OpenMP threads (0 = all cores)");
}

int run_classify(const TaskArgs& a) {
  const std::vector<std::string> lines = read_input_lines(a.input);
  const std::vector<std::string> members = expand_ensembles(a.checkpoints);
  std::vector<std::string> classes;
  std::vector<double> sum;  // lines x classes: the members' probabilities, summed
  for (const std::string& path : members) {
    TaskModel m = load_task_model(a, path, "classify");
    if (classes.empty()) {
      classes = m.ck.task.at("classes").get<std::vector<std::string>>();
      sum.assign(lines.size() * classes.size(), 0.0);
    }
    TRELLIS_REQUIRE(m.ck.task.at("classes") == classes,
                    "{}: its classes differ from those of {}", path, members[0]);
    ExampleSet set;  // the lines in this member's tokens
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::vector<uint32_t> ids = encode(*m.tokenizer, lines[i]);
      TRELLIS_REQUIRE(!ids.empty(), "{}:{}: empty text", a.input, i + 1);
      set.add(-1, ids);
    }
    add_class_probabilities(m.ck, m.format, set, int64_t(lines.size()), a.batch_size, DType::F32,
                            sum, a.tokenizer_dir);
  }
  const size_t K = classes.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    const double* p = sum.data() + i * K;
    nlohmann::ordered_json probs;
    for (size_t k = 0; k < K; ++k) probs[classes[k]] = p[k] / double(members.size());
    const nlohmann::ordered_json out = {
        {"label", classes[size_t(std::max_element(p, p + K) - p)]}, {"probabilities", probs}};
    fmt::print("{}\n", out.dump());
  }
  return 0;
}

int run_translate(const TaskArgs& a) {
  TaskModel m = load_task_model(a, a.checkpoints[0], "translate");
  const std::vector<std::string> lines = read_input_lines(a.input);
  LocalModel local(m.ck, nullptr, DType::F32, a.tokenizer_dir);
  ModelChunk& model = local.model;
  const DecodeOptions opt{a.beam, a.max_len, 0.6, m.format.special, m.format.T, !a.no_cache};
  for (size_t first = 0; first < lines.size(); first += size_t(a.batch_size)) {
    std::vector<std::vector<uint32_t>> ids;
    for (size_t i = first; i < std::min(lines.size(), first + size_t(a.batch_size)); ++i) {
      ids.push_back(encode(*m.tokenizer, lines[i]));
      TRELLIS_REQUIRE(int64_t(ids.back().size()) < m.format.T,
                      "{}:{}: {} tokens, more than the model's {} source positions allow", a.input,
                      i + 1, ids.back().size(), m.format.T - 1);
    }
    const std::vector<std::span<const uint32_t>> sources(ids.begin(), ids.end());
    for (const auto& out : translate(model, sources, opt)) {
      // One output line per input line: a line break the model learned from its targets (gettext
      // messages hold some) prints as a space.
      std::string text = m.tokenizer->decode(out);
      std::replace_if(
          text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
      fmt::print("{}\n", text);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command add_classify_command(CLI::App& app) {
  auto a = std::make_shared<TaskArgs>();
  CLI::App* sub = app.add_subcommand(
      "classify", "label each line of a text file with a classification checkpoint (JSON lines)");
  add_common_options(sub, *a, true);
  return {sub, [a](Communicator& world) {
            TRELLIS_REQUIRE(a->batch_size >= 1, "--batch-size must be >= 1");
            return world.rank() == 0 ? run_classify(*a) : 0;
          }};
}

Command add_translate_command(CLI::App& app) {
  auto a = std::make_shared<TaskArgs>();
  CLI::App* sub = app.add_subcommand(
      "translate", "translate each line of a text file with an encoder-decoder checkpoint");
  add_common_options(sub, *a, false);
  sub->add_option(
         "--beam", a->beam,
         "beam size (1 = greedy); hypotheses are ranked by log-probability / "
         "((5 + length) / 6)^0.6, the length penalty of GNMT used by the Transformer paper")
      ->capture_default_str();
  sub->add_option("--max-len", a->max_len, "most generated tokens (0 = the context)");
  sub->add_flag("--no-cache", a->no_cache,
                "re-run the whole prefix every step instead of the key/value cache (same output, "
                "slower; for checking)");
  return {sub, [a](Communicator& world) {
            TRELLIS_REQUIRE(a->batch_size >= 1 && a->beam >= 1,
                            "--batch-size and --beam must be >= 1");
            return world.rank() == 0 ? run_translate(*a) : 0;
          }};
}

}  // namespace trellis
