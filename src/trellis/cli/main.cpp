// trellis: train Transformers in C++ on one process or many (mpirun/srun).
#include <cstdio>
#include <exception>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/kernels/isa.h"

int main(int argc, char** argv) {
  using namespace trellis;
  std::unique_ptr<Communicator> world;
  try {
    world = make_world_communicator(&argc, &argv);
  } catch (const Error& e) {
    // e.g. srun tasks without an MPI bootstrap: the launch command is the bad input
    std::fprintf(stderr, "trellis: error: %s\n", e.what());
    return e.kind() == ErrorKind::Input ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trellis: error: %s\n", e.what());
    return 1;
  }
  CLI::App app{"trellis: Transformer training in C++ with data, tensor and pipeline parallelism"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {
      add_train_command(app),   add_eval_command(app),     add_sample_command(app),
      add_prepare_command(app), add_plot_command(app),     add_grad_command(app),
      add_bleu_command(app),    add_classify_command(app), add_translate_command(app),
      add_launch_command(app),  add_export_command(app),   add_average_command(app),
      add_plan_command(app),    add_calibrate_command(app), add_tokenize_command(app)};
  int code = 0;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help prints usage (rank 0 only); any other parse error is one line and exit code 2.
      if (e.get_exit_code() == 0) {
        if (world->rank() == 0) app.exit(e);
        code = 0;
      } else {
        if (world->rank() == 0) std::fprintf(stderr, "trellis: error: %s\n", e.what());
        code = 2;
      }
      world.reset();
      finalize_communication();
      return code;
    }
    cpu_isa();  // before any kernel runs: checks TRELLIS_ISA and caps oneDNN's dispatch
    for (const auto& c : commands)
      if (c.sub->parsed()) code = c.run(*world);
  } catch (const Error& e) {
    const int exit_code = e.kind() == ErrorKind::Input ? 2 : 1;
    if (world->size() > 1) world->abort(e.what(), exit_code);
    std::fprintf(stderr, "trellis: error: %s\n", e.what());
    return exit_code;
  } catch (const std::exception& e) {
    if (world->size() > 1) world->abort(e.what(), 1);
    std::fprintf(stderr, "trellis: error: %s\n", e.what());
    return 1;
  }
  world.reset();
  finalize_communication();
  return code;
}
