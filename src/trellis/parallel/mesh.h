#pragma once
// Process mesh: world = dp * tp * pp, rank order TP fastest, then DP, then PP (Megatron's), with
// one sub-communicator per axis.
#include <memory>

#include "trellis/comm/communicator.h"

namespace trellis {

struct MeshShape {
  int dp = 0, tp = 1, pp = 1;  // dp = 0: world / (tp * pp)
};

// The shape with dp resolved (dp = 0: world / (tp * pp)). Input error unless dp * tp * pp ==
// world_size; the Mesh and a run's validation (train/validate_run) both ask this.
MeshShape resolve_mesh_shape(MeshShape shape, int world_size);

class Mesh {
 public:
  // Validates the shape (resolve_mesh_shape) and splits the communicators.
  Mesh(Communicator& world, MeshShape shape);
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp_rank() const { return dp_rank_; }
  int tp_rank() const { return tp_rank_; }
  int pp_rank() const { return pp_rank_; }
  Communicator& world() { return world_; }
  Communicator& dp_comm() { return *dp_comm_; }
  Communicator& tp_comm() { return *tp_comm_; }
  Communicator& pp_comm() { return *pp_comm_; }

 private:
  Communicator& world_;
  int dp_, tp_, pp_, dp_rank_, tp_rank_, pp_rank_;
  std::unique_ptr<Communicator> dp_comm_, tp_comm_, pp_comm_;
};

}  // namespace trellis
