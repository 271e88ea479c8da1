// `trellis calibrate`: measure this machine into a planner machine file (plan/calibrate).
#include <fmt/core.h>
#include <omp.h>

#include <fstream>

#include "trellis/cli/commands.h"
#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/core/threads.h"
#include "trellis/plan/calibrate.h"
#include "trellis/plan/machine.h"

namespace trellis {

namespace {
struct CalibrateArgs {
  std::string out;
  int threads = 0, gemm_size = 1024, rounds = 3;
  double seconds = 0.3;
};
}  // namespace

Command add_calibrate_command(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "measure this machine (GEMM rates, memory bandwidth; all-reduce latency and bandwidth "
      "under mpirun) into a machine file for `trellis plan`");
  sub->add_option("--out", a->out, "machine file to write (JSON)")->required();
  sub->add_option("--threads", a->threads,
                  "threads per rank (default: as train, this node's cores / its ranks)");
  sub->add_option("--gemm-size", a->gemm_size, "n of the n x n x n GEMMs timed (default 1024)");
  sub->add_option("--seconds", a->seconds, "time per measurement (default 0.3)");
  sub->add_option("--rounds", a->rounds,
                  "rounds of the compute measurements; each keeps its fastest (default 3)");
  return {sub, [a](Communicator& world) {
            TRELLIS_REQUIRE(a->threads >= 0, "--threads must not be negative");
            omp_set_num_threads(a->threads > 0 ? a->threads : default_threads_per_rank());
            const nlohmann::json j = calibrate_machine(world, a->gemm_size, a->seconds, a->rounds);
            if (world.rank() != 0) return 0;
            parse_machine(j, a->out);  // what plan will read back
            std::ofstream f(a->out);
            TRELLIS_REQUIRE(f.good(), "{}: cannot write", a->out);
            f << j.dump(2) << "\n";
            TRELLIS_REQUIRE(f.good(), "{}: write failed", a->out);
            fmt::print(
                "trellis calibrate: {}: peak fp32 {:.1f} GFLOP/s, bf16 {:.1f} GFLOP/s per rank, "
                "GEMMs at {:.0f}% of it, memory {:.1f} GB/s, link {:.2f} GB/s, {:.1f} us\n",
                a->out, j["device"]["peak_flops"]["fp32"].get<double>() / 1e9,
                j["device"]["peak_flops"]["bf16"].get<double>() / 1e9,
                100 * j["device"]["gemm_efficiency"].get<double>(),
                j["device"]["memory_bandwidth"].get<double>() / 1e9,
                j["intra_node"]["bandwidth"].get<double>() / 1e9,
                j["intra_node"]["latency"].get<double>() * 1e6);
            return 0;
          }};
}

}  // namespace trellis
