#pragma once
// `trellis plot`: draws loss and val_loss from metrics.jsonl against step into an SVG file.
#include <string>

namespace trellis {

void plot_metrics_svg(const std::string& metrics_jsonl, const std::string& out_svg);

}  // namespace trellis
