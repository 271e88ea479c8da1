#include "trellis/train/metrics.h"

#include <filesystem>
#include <fstream>

#include "trellis/core/error.h"
#include "trellis/io/tfevents.h"
#include "trellis/train/fault.h"

namespace trellis {

MetricsLog::MetricsLog(const std::string& out_dir, bool tensorboard, int64_t resume_step) {
  std::filesystem::create_directories(out_dir);
  const std::string path = out_dir + "/metrics.jsonl";
  std::string kept;
  if (resume_step >= 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("step", int64_t(0)) <= resume_step) kept += line + "\n";
    }
  }
  jsonl_ = std::fopen(path.c_str(), "w");
  TRELLIS_REQUIRE(jsonl_ != nullptr, "{}: cannot open for writing", path);
  std::fwrite(kept.data(), 1, kept.size(), jsonl_);
  if (tensorboard) tb_ = std::make_unique<EventWriter>(out_dir + "/tb");
}

MetricsLog::~MetricsLog() {
  if (jsonl_) std::fclose(jsonl_);
}

void MetricsLog::write(const nlohmann::json& record, const std::string& tb_prefix) {
  // Rows written after `trellis launch` restarted the job say which restart wrote them.
  nlohmann::json row = record;
  if (restart_count() > 0) row["restart"] = restart_count();
  // Shortest round-trip formatting keeps every float exact in the text.
  const std::string line = row.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), jsonl_);
  std::fflush(jsonl_);
  if (!tb_) return;
  const int64_t step = record.value("step", int64_t(0));
  for (auto& [k, v] : record.items())
    if (v.is_number() && k != "step") {
      // "val_loss" under prefix "val" becomes "val/loss".
      std::string name = k;
      if (name.rfind(tb_prefix + "_", 0) == 0) name = name.substr(tb_prefix.size() + 1);
      tb_->add_scalar(tb_prefix + "/" + name, step, v.get<double>());
    }
  tb_->flush();
}

std::string format_duration(double s) {
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{}:{:02d}", t / 60, t % 60);
}

}  // namespace trellis
