#pragma once
// Chrome trace (chrome://tracing, Perfetto) of the pipeline schedule of every rank.
#include <string>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/parallel/mesh.h"
#include "trellis/parallel/pipeline/pipeline.h"

namespace trellis {

// Collective over world; rank 0 writes the file.
void write_trace(const std::string& path, Communicator& world, const Mesh& mesh,
                 const std::vector<TraceEvent>& events);

}  // namespace trellis
