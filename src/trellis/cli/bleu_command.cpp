// `trellis bleu`: corpus BLEU and chrF of a hypothesis file against one or more reference files,
// scored as sacreBLEU's command line scores them with its defaults.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/eval/bleu.h"

namespace trellis {

namespace {

// One string per line, as sacreBLEU reads a file: split at '\n' only, trailing whitespace
// stripped (so "\r\n" endings and trailing blanks do not count), no line after a final newline.
std::vector<std::string> read_sacrebleu_lines(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    // Whitespace as Python's str.rstrip() sees it; the metrics strip the Unicode cases again.
    while (!line.empty() && (line.back() == ' ' || (line.back() >= '\t' && line.back() <= '\r') ||
                             (line.back() >= 0x1c && line.back() <= 0x1f)))
      line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

struct BleuArgs {
  std::vector<std::string> refs;
  std::string hyp;
};

}  // namespace

Command add_bleu_command(CLI::App& app) {
  auto args = std::make_shared<BleuArgs>();
  CLI::App* sub = app.add_subcommand(
      "bleu",
      "corpus BLEU and chrF of a hypothesis file against reference files, as sacreBLEU computes "
      "them with its defaults (13a tokenizer, exp smoothing; chrF2); prints one JSON line");
  sub->add_option("--ref", args->refs,
                  "reference file, one sentence a line (repeat for several references)")
      ->required();
  sub->add_option("--hyp", args->hyp, "hypothesis file, one sentence a line")->required();
  return {sub, [args](Communicator& world) {
            const std::vector<std::string> hyps = read_sacrebleu_lines(args->hyp);
            ReferenceSets refs;
            for (const std::string& path : args->refs) {
              refs.push_back(read_sacrebleu_lines(path));
              TRELLIS_REQUIRE(refs.back().size() == hyps.size(),
                              "{} has {} lines but {} has {}: every reference file needs one "
                              "line per hypothesis",
                              path, refs.back().size(), args->hyp, hyps.size());
            }
            double bleu = 0.0, chrf = 0.0;
            try {
              bleu = corpus_bleu(hyps, refs).score;
              chrf = corpus_chrf(hyps, refs);
            } catch (const Error& e) {
              TRELLIS_REQUIRE(e.kind() != ErrorKind::Input, "{} / {}: {}", args->hyp,
                              fmt::join(args->refs, ", "), e.what());
              throw;
            }
            if (world.rank() == 0)
              fmt::print("{}\n", nlohmann::json{{"bleu", bleu}, {"chrf", chrf}}.dump());
            return 0;
          }};
}

}  // namespace trellis
