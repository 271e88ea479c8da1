#pragma once
// A description of a machine the planner predicts for (hardware/*.json): per-device peak FLOP/s
// per precision, memory and its bandwidth, and the links within a node and between nodes. The
// shipped files cite a vendor datasheet for every number that has one and say "assumed" for the
// rest (latencies, efficiencies).
#include <cstdint>
#include <map>
#include <string>

#include "nlohmann/json.hpp"

namespace trellis {

struct Link {
  double bandwidth = 0;   // bytes/s per device, each direction
  double latency = 0;     // seconds per collective step
  double efficiency = 1;  // fraction of `bandwidth` a collective reaches
  double effective_bandwidth() const { return bandwidth * efficiency; }
};

struct Machine {
  std::string name, path;
  int devices_per_node = 1;
  int64_t memory_bytes = 0;                  // per device
  double memory_bandwidth = 0;               // bytes/s per device (what memory-bound ops run at)
  std::map<std::string, double> peak_flops;  // "fp32", "tf32", "bf16": dense FLOP/s per device
  double gemm_efficiency = 1;                // fraction of the peak a GEMM reaches
  Link intra, inter;                         // within a node, between nodes
  // Input error naming the file when the precision is not described.
  double peak(const std::string& precision) const;
};

// Reads and checks a machine file; input errors name the file and the key (`FILE:
// device.peak_flops.bf16: ...`).
Machine load_machine(const std::string& path);
Machine parse_machine(const nlohmann::json& j, const std::string& where);

}  // namespace trellis
