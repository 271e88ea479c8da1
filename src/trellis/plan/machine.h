#pragma once
// A description of a machine the planner predicts for (hardware/*.json): per-device peak FLOP/s
// per precision, memory and its bandwidth, and the links within a node and between nodes. The
// shipped files cite a vendor datasheet for every number that has one and say "assumed" for the
// rest (latencies, efficiencies).
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace trellis {

// One collective's ring model: a collective of `steps` ring steps, each moving a message of m
// bytes, takes steps * step_seconds(m). Where `trellis calibrate` measured it, a step's time is
// interpolated from the table of measured sizes (over TCP a few-MiB message can move at half the
// rate of a 64 MiB one, which no single latency and bandwidth describe); otherwise, and beyond
// the largest size measured, it is latency + m / bandwidth.
struct CollectiveFit {
  double latency = 0, bandwidth = 0;
  std::vector<std::array<double, 2>> per_step;  // {message bytes, seconds}, bytes increasing
  double step_seconds(double message_bytes) const;
};

struct Link {
  double bandwidth = 0;   // bytes/s per device, each direction
  double latency = 0;     // seconds per collective step
  double efficiency = 1;  // fraction of `bandwidth` a collective reaches
  // Measured fits per collective ("all_reduce", "reduce_scatter", "all_gather", "send_recv"),
  // from `trellis calibrate`; a collective not listed uses the link's own numbers.
  std::map<std::string, CollectiveFit> collectives;
  double effective_bandwidth() const { return bandwidth * efficiency; }
  // A ring step of `collective` moving message_bytes: its calibrated fit, else the link's own.
  double step_seconds(const std::string& collective, double message_bytes) const;
};

// A GEMM's time as calibrated: 2MNK / rate + element_s * (MK + KN + MN) + call_s. The element
// term is what grows with the operands rather than the FLOPs (packing, bf16 conversion), the
// call term a fixed cost per call; both matter for the small GEMMs of small micro-batches.
struct GemmFit {
  double rate = 0, element_s = 0, call_s = 0;
  double seconds(double m, double n, double k) const {
    return 2 * m * n * k / rate + element_s * (m * k + k * n + m * n) + call_s;
  }
};

struct Machine {
  std::string name, path;
  int devices_per_node = 1;
  int64_t memory_bytes = 0;                  // per device
  double memory_bandwidth = 0;               // bytes/s per device (what memory-bound ops run at)
  std::map<std::string, double> peak_flops;  // "fp32", "tf32", "bf16": dense FLOP/s per device
  double gemm_efficiency = 1;                // fraction of the peak a GEMM reaches
  std::map<std::string, GemmFit> gemm;       // per precision, when calibrated (else the two above)
  // The input- and weight-gradient GEMMs of a forward M x N x K, together (their seconds are
  // gemm_backward[p].seconds(M, N, K)); where not calibrated, twice the forward GEMM.
  std::map<std::string, GemmFit> gemm_backward;
  // Measured by `trellis calibrate` (0: not described; the GEMM rate and memory bandwidth
  // stand in): trellis's attention kernels as FLOP/s of the products, and the bytes/s of its
  // memory-bound ops (norms, activations).
  double attention_flops = 0, elementwise_bandwidth = 0;
  // Bytes/s at which released pages come back when written again (a page fault and zeroing per
  // page): what ZeRO-2/3 pay for each block's gradients and parameters they give back. 0: free.
  // 4 KiB pages, and 2 MiB ones (PageBuffer's where a released range covers them; 0: as 4 KiB).
  double page_refill_bandwidth = 0, huge_page_refill_bandwidth = 0;
  Link intra, inter;                         // within a node, between nodes
  // Input error naming the file when the precision is not described.
  double peak(const std::string& precision) const;
};

// Reads and checks a machine file; input errors name the file and the key (`FILE:
// device.peak_flops.bf16: ...`).
Machine load_machine(const std::string& path);
Machine parse_machine(const nlohmann::json& j, const std::string& where);

}  // namespace trellis
