// `trellis export`: a training checkpoint (sharded, from any layout) as a Hugging Face directory.
#include <fmt/core.h>

#include <cstdio>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/io/sharded_checkpoint.h"

namespace trellis {

namespace {
struct ExportArgs {
  std::string checkpoint, out;
  // Hugging Face's default shard size; tests set a small one to exercise the sharded form.
  size_t max_shard_bytes = size_t(2) << 30;
};
}  // namespace

Command add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand(
      "export",
      "write a checkpoint as a Hugging Face directory (config.json + model.safetensors, or "
      "model-*.safetensors with model.safetensors.index.json above 2 GB)");
  sub->add_option("--checkpoint", a->checkpoint,
                  "checkpoint directory (OUT/step_NNNNNNNN or OUT/best)")
      ->required();
  sub->add_option("--out", a->out, "Hugging Face directory to write")->required();
  // Hidden (no description group): the size above which the weights are split into files.
  sub->add_option("--max-shard-bytes", a->max_shard_bytes)->group("");
  return {sub, [a](Communicator& world) {
            if (world.rank() != 0) return 0;
            TRELLIS_REQUIRE(a->max_shard_bytes > 0, "--max-shard-bytes must be positive");
            const auto files = export_checkpoint(a->checkpoint, a->out, a->max_shard_bytes);
            fmt::print("trellis: exported {} to {} ({} files)\n", a->checkpoint, a->out,
                       files.size());
            return 0;
          }};
}

}  // namespace trellis
