#include "trellis/parallel/global_view.h"

#include <algorithm>

namespace trellis {

std::vector<float> gather_global(Mesh& mesh, const ParamLayout& local, const float* data) {
  const ModelConfig& mc = local.config();
  const ParamLayout global(mc);
  std::vector<float> out(global.size(), 0.0f);
  std::vector<float> all(local.size() * size_t(local.tp()));
  if (local.tp() > 1)
    mesh.tp_comm().all_gather_async(data, all.data(), local.size())->wait();
  else
    std::copy_n(data, local.size(), all.begin());
  for (int r = 0; r < local.tp(); ++r)
    scatter_to_global(ParamLayout(mc, local.tp(), r, &local.stage()), global,
                      all.data() + local.size() * size_t(r), out.data());
  if (mesh.pp() > 1) {
    // Each stage filled its own tensors (x + 0 is exact); copies of tied tensors stay out.
    for (const auto& s : local.specs())
      if (s.tied_copy) {
        const ParamSpec& g = global.spec(s.name);
        std::fill_n(out.begin() + long(g.offset), g.numel(), 0.0f);
      }
    mesh.pp_comm().all_reduce(out.data(), out.size());
  }
  return out;
}

}  // namespace trellis
