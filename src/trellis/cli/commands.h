#pragma once
// Subcommands of the `trellis` binary. Each registers its subcommand and options on the CLI11 app
// and returns the action to run when that subcommand was chosen.
#include <CLI/CLI.hpp>
#include <functional>

namespace trellis {

class Communicator;
struct Command {
  CLI::App* sub;
  std::function<int(Communicator& world)> run;
};

Command add_train_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_grad_command(CLI::App& app);
Command add_sample_command(CLI::App& app);
Command add_prepare_command(CLI::App& app);
Command add_plot_command(CLI::App& app);
Command add_bleu_command(CLI::App& app);
Command add_classify_command(CLI::App& app);
Command add_translate_command(CLI::App& app);
Command add_launch_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_average_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_calibrate_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);

}  // namespace trellis
