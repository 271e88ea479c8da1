#include "trellis/parallel/mesh.h"

#include "trellis/core/error.h"

namespace trellis {

MeshShape resolve_mesh_shape(MeshShape shape, int world_size) {
  const int n = world_size;
  TRELLIS_REQUIRE(shape.tp >= 1 && shape.pp >= 1 && shape.dp >= 0,
                  "layout dp={} x tp={} x pp={}: tp and pp must be >= 1 and dp >= 0 (0: the rest)",
                  shape.dp, shape.tp, shape.pp);
  if (shape.dp == 0) {
    TRELLIS_REQUIRE(n % (shape.tp * shape.pp) == 0,
                    "layout tp={} x pp={} = {} does not divide the world size {}", shape.tp,
                    shape.pp, shape.tp * shape.pp, n);
    shape.dp = n / (shape.tp * shape.pp);
  }
  TRELLIS_REQUIRE(static_cast<long long>(shape.dp) * shape.tp * shape.pp == n,
                  "layout dp={} x tp={} x pp={} = {} does not match the world size {}", shape.dp,
                  shape.tp, shape.pp, static_cast<long long>(shape.dp) * shape.tp * shape.pp, n);
  return shape;
}

Mesh::Mesh(Communicator& world, MeshShape shape) : world_(world) {
  shape = resolve_mesh_shape(shape, world.size());
  dp_ = shape.dp;
  tp_ = shape.tp;
  pp_ = shape.pp;

  // world rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank (TP fastest, then DP, then PP):
  // TP groups are neighbouring ranks, which share a node when a node holds several ranks.
  const int r = world.rank();
  tp_rank_ = r % tp_;
  dp_rank_ = (r / tp_) % dp_;
  pp_rank_ = r / (tp_ * dp_);

  // Every rank performs the same three splits in the same order.
  tp_comm_ = world.split(pp_rank_ * dp_ + dp_rank_, tp_rank_);
  tp_comm_->set_name("tp");
  dp_comm_ = world.split(pp_rank_ * tp_ + tp_rank_, dp_rank_);
  dp_comm_->set_name("dp");
  pp_comm_ = world.split(dp_rank_ * tp_ + tp_rank_, pp_rank_);
  pp_comm_->set_name("pp");
}

}  // namespace trellis
