#include "trellis/plan/machine.h"

#include <fmt/core.h>

#include <cmath>
#include <fstream>

#include "trellis/core/error.h"

namespace trellis {

namespace {

const nlohmann::json& member(const nlohmann::json& j, const char* key, const std::string& where,
                             const std::string& path) {
  TRELLIS_REQUIRE(j.is_object(), "{}: {}: expected an object", where, path);
  auto it = j.find(key);
  TRELLIS_REQUIRE(it != j.end(), "{}: {}{}: missing", where, path.empty() ? "" : path + ".", key);
  return *it;
}

double positive(const nlohmann::json& j, const char* key, const std::string& where,
                const std::string& path, double max = INFINITY) {
  const nlohmann::json& v = member(j, key, where, path);
  const std::string name = (path.empty() ? "" : path + ".") + key;
  TRELLIS_REQUIRE(v.is_number(), "{}: {}: expected a number", where, name);
  const double x = v.get<double>();
  TRELLIS_REQUIRE(std::isfinite(x) && x > 0 && x <= max, "{}: {}: {} is out of range (0, {}]",
                  where, name, x, max);
  return x;
}

double non_negative(const nlohmann::json& j, const char* key, const std::string& where,
                    const std::string& path) {
  const nlohmann::json& v = member(j, key, where, path);
  TRELLIS_REQUIRE(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 &&
                      v.get<double>() <= 1.0,
                  "{}: {}.{}: expected a number of seconds in [0, 1]", where, path, key);
  return v.get<double>();
}

GemmFit parse_gemm_fit(const nlohmann::json& j, const std::string& where, const std::string& at) {
  return {positive(j, "rate", where, at), non_negative(j, "element_s", where, at),
          non_negative(j, "call_s", where, at)};
}

// A collective's measured step times: [{"bytes": message, "seconds": per step}, ...], at least
// two, bytes increasing.
std::vector<std::array<double, 2>> parse_per_step(const nlohmann::json& t, const std::string& where,
                                                  const std::string& path) {
  TRELLIS_REQUIRE(t.is_array() && t.size() >= 2,
                  "{}: {}.per_step: expected an array of at least two {{bytes, seconds}}", where,
                  path);
  std::vector<std::array<double, 2>> rows;
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string at = fmt::format("{}.per_step[{}]", path, i);
    rows.push_back({positive(t[i], "bytes", where, at), positive(t[i], "seconds", where, at, 1e3)});
    TRELLIS_REQUIRE(i == 0 || rows[i][0] > rows[i - 1][0],
                    "{}: {}.bytes: {} is not above the previous size", where, at, rows[i][0]);
  }
  return rows;
}

Link parse_link(const nlohmann::json& j, const std::string& where, const std::string& path) {
  const nlohmann::json& l = member(j, path.c_str(), where, "");
  Link link;
  link.bandwidth = positive(l, "bandwidth", where, path);
  link.latency = positive(l, "latency", where, path, 1.0);
  link.efficiency = l.contains("efficiency") ? positive(l, "efficiency", where, path, 1.0) : 1.0;
  if (l.contains("collectives")) {
    const nlohmann::json& cs = l["collectives"];
    TRELLIS_REQUIRE(cs.is_object(), "{}: {}.collectives: expected an object", where, path);
    for (auto it = cs.begin(); it != cs.end(); ++it) {
      const std::string& k = it.key();
      TRELLIS_REQUIRE(k == "all_reduce" || k == "reduce_scatter" || k == "all_gather" ||
                          k == "send_recv",
                      "{}: {}.collectives.{}: unknown collective (all_reduce, reduce_scatter, "
                      "all_gather, send_recv)",
                      where, path, k);
      const std::string at = path + ".collectives." + k;
      CollectiveFit& f = link.collectives[k];
      f.latency = positive(*it, "latency", where, at, 1.0);
      f.bandwidth = positive(*it, "bandwidth", where, at);
      if (it->contains("per_step")) f.per_step = parse_per_step((*it)["per_step"], where, at);
    }
  }
  return link;
}

}  // namespace

double CollectiveFit::step_seconds(double m) const {
  if (per_step.size() < 2) return latency + m / bandwidth;
  if (m <= per_step.front()[0]) return per_step.front()[1];
  if (m >= per_step.back()[0]) return per_step.back()[1] + (m - per_step.back()[0]) / bandwidth;
  size_t i = 1;
  while (per_step[i][0] < m) ++i;
  const auto& [m0, t0] = per_step[i - 1];
  const auto& [m1, t1] = per_step[i];
  return t0 + (m - m0) / (m1 - m0) * (t1 - t0);
}

double Link::step_seconds(const std::string& collective, double message_bytes) const {
  auto it = collectives.find(collective);
  return it != collectives.end() ? it->second.step_seconds(message_bytes)
                                 : latency + message_bytes / effective_bandwidth();
}

double Machine::peak(const std::string& precision) const {
  auto it = peak_flops.find(precision);
  TRELLIS_REQUIRE(it != peak_flops.end(), "{}: device.peak_flops.{}: not described", path,
                  precision);
  return it->second;
}

Machine parse_machine(const nlohmann::json& j, const std::string& where) {
  Machine m;
  m.path = where;
  const nlohmann::json& name = member(j, "name", where, "");
  TRELLIS_REQUIRE(name.is_string(), "{}: name: expected a string", where);
  m.name = name.get<std::string>();
  m.devices_per_node = int(positive(j, "devices_per_node", where, "", 1 << 16));
  TRELLIS_REQUIRE(double(m.devices_per_node) == j["devices_per_node"].get<double>(),
                  "{}: devices_per_node: expected an integer", where);
  const nlohmann::json& d = member(j, "device", where, "");
  m.memory_bytes = int64_t(positive(d, "memory_bytes", where, "device", 1e15));
  m.memory_bandwidth = positive(d, "memory_bandwidth", where, "device");
  m.gemm_efficiency = positive(d, "gemm_efficiency", where, "device", 1.0);
  const nlohmann::json& peaks = member(d, "peak_flops", where, "device");
  TRELLIS_REQUIRE(peaks.is_object() && !peaks.empty(),
                  "{}: device.peak_flops: expected an object of precision: FLOP/s", where);
  for (auto it = peaks.begin(); it != peaks.end(); ++it) {
    TRELLIS_REQUIRE(it.key() == "fp32" || it.key() == "tf32" || it.key() == "bf16",
                    "{}: device.peak_flops.{}: unknown precision (fp32, tf32, bf16)", where,
                    it.key());
    m.peak_flops[it.key()] = positive(peaks, it.key().c_str(), where, "device.peak_flops");
  }
  if (d.contains("gemm")) {
    const nlohmann::json& g = d["gemm"];
    TRELLIS_REQUIRE(g.is_object(), "{}: device.gemm: expected an object of precision: fit", where);
    for (auto it = g.begin(); it != g.end(); ++it) {
      const std::string at = "device.gemm." + it.key();
      TRELLIS_REQUIRE(m.peak_flops.count(it.key()), "{}: {}: no peak_flops for this precision",
                      where, at);
      m.gemm[it.key()] = parse_gemm_fit(*it, where, at);
      if (it->contains("backward"))
        m.gemm_backward[it.key()] = parse_gemm_fit((*it)["backward"], where, at + ".backward");
    }
  }
  if (d.contains("attention_flops"))
    m.attention_flops = positive(d, "attention_flops", where, "device");
  if (d.contains("elementwise_bandwidth"))
    m.elementwise_bandwidth = positive(d, "elementwise_bandwidth", where, "device");
  if (d.contains("page_refill_bandwidth"))
    m.page_refill_bandwidth = positive(d, "page_refill_bandwidth", where, "device");
  if (d.contains("huge_page_refill_bandwidth"))
    m.huge_page_refill_bandwidth = positive(d, "huge_page_refill_bandwidth", where, "device");
  m.intra = parse_link(j, where, "intra_node");
  m.inter = parse_link(j, where, "inter_node");
  return m;
}

Machine load_machine(const std::string& path) {
  std::ifstream in(path);
  TRELLIS_REQUIRE(in.good(), "{}: cannot open the machine file", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TRELLIS_REQUIRE(false, "{}: not valid JSON: {}", path, e.what());
  }
  return parse_machine(j, path);
}

}  // namespace trellis
