#pragma once
// Rank 0's outputs of a run: metrics.jsonl (one object per step / validation), TensorBoard
// scalars and the console progress line.
#include <cstdio>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"

namespace trellis {

class EventWriter;

class MetricsLog {
 public:
  // resume_step >= 0: keep the existing metrics.jsonl lines up to that step (a resumed run
  // replays what came after its checkpoint); -1: start a new file.
  MetricsLog(const std::string& out_dir, bool tensorboard, int64_t resume_step);
  ~MetricsLog();
  // Appends the object to metrics.jsonl; numeric fields also go to TensorBoard under prefix/key.
  void write(const nlohmann::json& record, const std::string& tb_prefix);

 private:
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<EventWriter> tb_;
};

// "1:02:03" / "2:03" style duration.
std::string format_duration(double seconds);

}  // namespace trellis
