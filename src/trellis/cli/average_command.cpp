// `trellis average`: several checkpoints' parameters averaged into one checkpoint.
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/io/average.h"

namespace trellis {

namespace {
struct AverageArgs {
  std::vector<std::string> checkpoints;
  std::string out;
};
}  // namespace

Command add_average_command(CLI::App& app) {
  auto a = std::make_shared<AverageArgs>();
  CLI::App* sub = app.add_subcommand(
      "average",
      "average the parameters of checkpoints of one run (same model and layout) into a new "
      "single-rank checkpoint without optimizer state, as fairseq's average_checkpoints.py");
  sub->add_option("--checkpoints", a->checkpoints,
                  "checkpoint directories (at least 2; OUT/step_NNNNNNNN or OUT/best); the first "
                  "one's config.json and tokenizer go with the result")
      ->required();
  sub->add_option("--out", a->out, "checkpoint directory to write (must not exist)")->required();
  return {sub, [a](Communicator& world) {
            if (world.rank() != 0) return 0;
            const AverageResult r = average_checkpoints(a->checkpoints, a->out);
            fmt::print("trellis: averaged {} checkpoints into {} ({} tensors, {} values)\n",
                       a->checkpoints.size(), r.out, r.tensors, r.parameters);
            return 0;
          }};
}

}  // namespace trellis
