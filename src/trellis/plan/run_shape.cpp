#include "trellis/plan/run_shape.h"

#include "trellis/core/error.h"
#include "trellis/model/params.h"
#include "trellis/parallel/zero.h"
#include "trellis/plan/memory_plan.h"

namespace trellis {

void check_run_shape(const RunShape& run) {
  const int V = run.virtual_stages;
  TRELLIS_REQUIRE(V >= 1, "virtual_stages must be >= 1");
  TRELLIS_REQUIRE(V == 1 || run.schedule == ScheduleKind::Interleaved,
                  "virtual_stages={} needs --schedule interleaved", V);
  zero_stage(run.zero);  // the range
  // ZeRO-2/3 reduce (and ZeRO-3 gathers) per block inside each micro-batch's backward; a
  // pipeline interleaves micro-batches across stages. DeepSpeed refuses the same combination.
  TRELLIS_REQUIRE(run.zero <= 1 || run.pp == 1,
                  "zero {} with pipeline parallelism (pp {}) is not supported: use zero 1 with "
                  "pp, or zero 2/3 with dp and tp",
                  run.zero, run.pp);
  // zb1 fills a pipeline's bubble; its weight part reads every linear layer's kept input.
  TRELLIS_REQUIRE(run.schedule != ScheduleKind::ZeroBubble || run.pp >= 2,
                  "schedule zb1 needs pp >= 2 (got pp {}): without a pipeline there is no bubble "
                  "to fill",
                  run.pp);
  TRELLIS_REQUIRE(run.schedule != ScheduleKind::ZeroBubble || run.recompute == Recompute::None,
                  "schedule zb1 needs recompute none (got recompute {}): its weight-gradient ops "
                  "read the activations recompute drops",
                  recompute_name(run.recompute));
  TRELLIS_REQUIRE(!run.sequence_parallel || run.seq_len % run.tp == 0,
                  "sequence parallelism needs seq_len {} divisible by tp={}", run.seq_len, run.tp);
  // These rules do not depend on the rank: pipeline and tensor-parallel rank 0 stand for all.
  const RankChunks first = rank_chunks(run.model, run.pp, V, run.layer_split, 0);
  build_schedule(run.schedule, run.pp, 0, int(run.accum), V);
  (void)ParamLayout(run.model, run.tp, 0, &first.stage);
}

}  // namespace trellis
