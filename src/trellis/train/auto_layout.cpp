#include "trellis/train/auto_layout.h"

#include <fmt/core.h>

#include <omp.h>

#include <cstdlib>

#include "trellis/comm/communicator.h"
#include "trellis/core/error.h"
#include "trellis/core/threads.h"
#include "trellis/kernels/isa.h"
#include "trellis/parallel/data_parallel.h"
#include "trellis/plan/calibrate.h"
#include "trellis/plan/planner.h"

namespace trellis {

namespace {

int ranks_per_node(int world) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
  return local ? std::max(1, std::atoi(local)) : world;
}

}  // namespace

TrainConfig choose_auto_layout(TrainConfig cfg, const RunData& data, Communicator& world) {
  const TrainConfig plain;
  const char* given = cfg.dp != plain.dp                   ? "dp"
                      : cfg.tp != plain.tp                 ? "tp"
                      : cfg.pp != plain.pp                 ? "pp"
                      : cfg.schedule != plain.schedule     ? "schedule"
                      : cfg.virtual_stages != plain.virtual_stages ? "virtual_stages"
                      : !cfg.layer_split.empty()           ? "layer_split"
                      : cfg.zero != plain.zero             ? "zero"
                      : cfg.recompute != plain.recompute   ? "recompute"
                      : cfg.sequence_parallel              ? "sequence_parallel"
                      : cfg.micro_batch_size != plain.micro_batch_size ? "micro_batch_size"
                                                                       : nullptr;
  TRELLIS_REQUIRE(!given,
                  "layout auto chooses dp, tp, pp, schedule, virtual stages, ZeRO, recompute, "
                  "sequence parallelism and the micro-batch: {} must not be set with it",
                  given);
  // Every rank takes part in the calibration; rank 0 plans and tells the others.
  Machine machine;
  if (!cfg.machine.empty())
    machine = load_machine(cfg.machine);
  else {
    omp_set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads_per_rank());  // as train
    // A quick calibration (one round, short windows): `trellis calibrate` takes its time.
    machine = parse_machine(calibrate_machine(world, 512, 0.05, 1), "this machine (calibrated)");
  }
  PlanRequest req;
  req.model = data.model;
  req.world = world.size();
  req.ranks_per_node = ranks_per_node(world.size());
  req.batch = cfg.batch_size;
  req.seq_len = data.T;
  req.precision = choose_precision(cfg.precision).compute == DType::BF16 ? "bf16" : "fp32";
  req.bf16_grad_reduce = grad_reduce_dtype(cfg.grad_reduce_dtype) == GradReduceDtype::Bf16;
  req.optimizer = cfg.optim.name;
  float choice[9] = {};  // dp tp pp virtual schedule zero recompute sp micro (exact as floats)
  std::string error;
  if (world.rank() == 0) {
    const Plan plan = make_plan(req, machine);
    if (plan.fitting == 0) {
      error = plan.smallest_world
                  ? fmt::format("layout auto: no layout of {} ranks fits {:.3g} GiB per rank; "
                                "the smallest world that fits is {} ranks ({})",
                                req.world, double(machine.memory_bytes) / (1 << 30),
                                plan.smallest_world, plan.smallest.layout.describe())
                  : fmt::format("layout auto: no layout fits {:.3g} GiB per rank at any world "
                                "size",
                                double(machine.memory_bytes) / (1 << 30));
    } else {
      const Candidate& c = plan.candidates.front();
      const Layout& l = c.layout;
      const float v[9] = {float(l.dp),        float(l.tp),   float(l.pp),
                          float(l.virtual_stages), float(int(l.schedule)), float(l.zero),
                          float(int(l.recompute)), float(l.sequence_parallel),
                          float(l.micro_batch)};
      std::copy(v, v + 9, choice);
      if (!cfg.quiet)
        fmt::print("trellis: layout auto: {} (predicted {:.1f} ms per step, {:.1f} MiB on the "
                   "largest rank; first of {} fitting layouts on {}; `trellis plan` shows the "
                   "rest)\n",
                   l.describe(), c.cost.step_s * 1e3, double(c.memory.total()) / (1 << 20),
                   plan.fitting, machine.name);
    }
  }
  // An error on rank 0 ends the job there, naming it; the others wait in the broadcast.
  TRELLIS_REQUIRE(error.empty(), "{}", error);
  world.broadcast_async(choice, 9, 0)->wait();
  cfg.dp = int(choice[0]);
  cfg.tp = int(choice[1]);
  cfg.pp = int(choice[2]);
  cfg.virtual_stages = int(choice[3]);
  cfg.schedule = schedule_name(ScheduleKind(int(choice[4])));
  cfg.zero = int(choice[5]);
  cfg.recompute = recompute_name(Recompute(int(choice[6])));
  cfg.sequence_parallel = choice[7] != 0;
  cfg.micro_batch_size = int64_t(choice[8]);
  return cfg;
}

}  // namespace trellis
