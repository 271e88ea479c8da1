// `trellis plot`: loss curves from metrics.jsonl as an SVG, no TensorBoard needed.
#include <fmt/format.h>

#include "trellis/cli/commands.h"
#include "trellis/io/plot.h"

namespace trellis {

Command add_plot_command(CLI::App& app) {
  auto paths = std::make_shared<std::pair<std::string, std::string>>();
  CLI::App* sub = app.add_subcommand("plot", "draw loss and val loss from metrics.jsonl (SVG)");
  sub->add_option("metrics", paths->first, "metrics.jsonl of a run")->required();
  sub->add_option("-o,--output", paths->second, "output .svg file")->required();
  return {sub, [paths](Communicator&) {
            plot_metrics_svg(paths->first, paths->second);
            fmt::print("trellis: wrote {}\n", paths->second);
            return 0;
          }};
}

}  // namespace trellis
