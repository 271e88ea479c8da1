#include "trellis/io/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"

namespace trellis {

namespace {

struct Point {
  double x, y;
};

struct Axis {
  double lo, hi, step;  // ticks at lo, lo+step, ..., hi
};

// Heckbert's "nice numbers": ticks at 1, 2 or 5 times a power of ten so labels read as round.
double nice_number(double x, bool round) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  double nf;
  if (round)
    nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  else
    nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nf * std::pow(10.0, e);
}

Axis nice_axis(double lo, double hi, int ticks) {
  if (!(hi > lo)) {  // one value (or one step): open a window around it so it is drawable
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  const double range = nice_number(hi - lo, false);
  const double step = nice_number(range / (ticks - 1), true);
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) v = 0;  // avoid "-0" and 1e-17 from accumulated steps
  const int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// Reads the number under `key`, or returns false when the line has none usable. A diverged run may
// log null; such points are skipped rather than failing the whole plot.
bool read_number(const nlohmann::json& obj, const char* key, const std::string& where,
                 double& out) {
  if (!obj.contains(key)) return false;
  const auto& v = obj[key];
  if (v.is_null()) return false;
  TRELLIS_REQUIRE(v.is_number(), "{}: \"{}\" is not a number", where, key);
  out = v.get<double>();
  return std::isfinite(out);
}

struct LossCurves {
  std::vector<Point> train, val;  // (step, loss), by step
};

// The "loss" and "val_loss" points of a metrics.jsonl, each series sorted by step.
LossCurves read_loss_curves(const std::string& metrics_jsonl) {
  const std::string text = read_file(metrics_jsonl);
  LossCurves c;
  std::istringstream in(text);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", metrics_jsonl, lineno);
    nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    TRELLIS_REQUIRE(!obj.is_discarded(), "{}: not JSON", where);
    TRELLIS_REQUIRE(obj.is_object(), "{}: not a JSON object", where);
    double loss = 0, val_loss = 0, step = 0;
    const bool has_loss = read_number(obj, "loss", where, loss);
    const bool has_val = read_number(obj, "val_loss", where, val_loss);
    if (!has_loss && !has_val) continue;
    TRELLIS_REQUIRE(read_number(obj, "step", where, step), "{}: has a loss but no \"step\"", where);
    if (has_loss) c.train.push_back({step, loss});
    if (has_val) c.val.push_back({step, val_loss});
  }
  TRELLIS_REQUIRE(!c.train.empty() || !c.val.empty(),
                  "{}: no \"loss\" or \"val_loss\" points to plot", metrics_jsonl);
  auto by_step = [](const Point& a, const Point& b) { return a.x < b.x; };
  std::stable_sort(c.train.begin(), c.train.end(), by_step);
  std::stable_sort(c.val.begin(), c.val.end(), by_step);
  return c;
}

// The page's geometry and the plot area's axes: where a (step, loss) point is drawn.
struct Frame {
  Axis ax, ay;
  double W = 800, H = 500, left = 75, right = 25, top = 45, bottom = 55;
  double pw = W - left - right, ph = H - top - bottom;
  double sx(double x) const { return left + (x - ax.lo) / (ax.hi - ax.lo) * pw; }
  double sy(double y) const { return top + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; }
};

Frame frame_for(const LossCurves& c) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto* series : {&c.train, &c.val})
    for (const Point& p : *series) {
      xmin = std::min(xmin, p.x), xmax = std::max(xmax, p.x);
      ymin = std::min(ymin, p.y), ymax = std::max(ymax, p.y);
    }
  Frame f;
  f.ax = nice_axis(xmin, xmax, 8);
  f.ay = nice_axis(ymin, ymax, 6);
  return f;
}

// The SVG header, title, grid, tick labels, axis titles and the plot area's border.
std::string svg_axes(const Frame& f, const std::string& title) {
  const double W = f.W, H = f.H, left = f.left, top = f.top, pw = f.pw, ph = f.ph;
  const Axis &ax = f.ax, &ay = f.ay;
  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H);
  s += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  s += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
                   W / 2, xml_escape(title));

  // Grid and tick labels; index-based so floating-point accumulation cannot drop the last tick.
  const int nx = int(std::lround((ax.hi - ax.lo) / ax.step)),
            ny = int(std::lround((ay.hi - ay.lo) / ay.step));
  s += "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (int i = 0; i <= nx; ++i) {
    const double x = f.sx(ax.lo + i * ax.step);
    s += fmt::format("<line x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\"/>\n", x, top, x,
                     top + ph);
  }
  for (int i = 0; i <= ny; ++i) {
    const double y = f.sy(ay.lo + i * ay.step);
    s += fmt::format("<line x1=\"{}\" y1=\"{:.2f}\" x2=\"{}\" y2=\"{:.2f}\"/>\n", left, y,
                     left + pw, y);
  }
  s += "</g>\n<g fill=\"#333\">\n";
  for (int i = 0; i <= nx; ++i) {
    const double v = ax.lo + i * ax.step;
    s += fmt::format("<text x=\"{:.2f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", f.sx(v),
                     top + ph + 18, tick_label(v, ax.step));
  }
  for (int i = 0; i <= ny; ++i) {
    const double v = ay.lo + i * ay.step;
    s += fmt::format("<text x=\"{}\" y=\"{:.2f}\" text-anchor=\"end\">{}</text>\n", left - 8,
                     f.sy(v) + 4, tick_label(v, ay.step));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", left + pw / 2,
                   H - 12);
  s += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">loss"
      "</text>\n",
      top + ph / 2);
  s += "</g>\n";
  s += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left,
      top, pw, ph);
  return s;
}

const char* const kTrainColour = "#1f77b4";
const char* const kValColour = "#d62728";

std::string svg_polyline(const Frame& f, const std::vector<Point>& pts, const char* colour) {
  std::string p;
  for (const Point& q : pts) p += fmt::format("{:.2f},{:.2f} ", f.sx(q.x), f.sy(q.y));
  if (!p.empty()) p.pop_back();
  return fmt::format(
      "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
      "stroke-linejoin=\"round\" points=\"{}\"/>\n",
      colour, p);
}

// The training curve as a line; validation as a line with a dot at each evaluation.
std::string svg_curves(const Frame& f, const LossCurves& c) {
  std::string s;
  if (!c.train.empty()) s += svg_polyline(f, c.train, kTrainColour);
  if (!c.val.empty()) {
    s += svg_polyline(f, c.val, kValColour);
    s += fmt::format("<g fill=\"{}\">\n", kValColour);
    for (const Point& q : c.val)
      s += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\"/>\n", f.sx(q.x), f.sy(q.y));
    s += "</g>\n";
  }
  return s;
}

// Legend in the top-right corner of the plot area.
std::string svg_legend(const Frame& f, const LossCurves& c) {
  const double lx = f.left + f.pw - 130, ly = f.top + 10;
  std::string s = fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"120\" height=\"{}\" fill=\"white\" "
      "fill-opacity=\"0.85\" stroke=\"#999\"/>\n",
      lx, ly, c.val.empty() || c.train.empty() ? 26 : 44);
  double row = ly + 17;
  if (!c.train.empty()) {
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
        "<text x=\"{4}\" y=\"{5}\">train loss</text>\n",
        lx + 8, row - 4, lx + 32, kTrainColour, lx + 40, row);
    row += 18;
  }
  if (!c.val.empty())
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
        "<circle cx=\"{6}\" cy=\"{1}\" r=\"3\" fill=\"{3}\"/>"
        "<text x=\"{4}\" y=\"{5}\">val loss</text>\n",
        lx + 8, row - 4, lx + 32, kValColour, lx + 40, row, lx + 20);
  return s;
}

}  // namespace

void plot_metrics_svg(const std::string& metrics_jsonl, const std::string& out_svg) {
  const LossCurves curves = read_loss_curves(metrics_jsonl);
  const Frame frame = frame_for(curves);
  const std::string svg = svg_axes(frame, "Loss — " + metrics_jsonl) + svg_curves(frame, curves) +
                          svg_legend(frame, curves) + "</svg>\n";
  write_file_atomic(out_svg, svg);
}

}  // namespace trellis
