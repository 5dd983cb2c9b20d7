#include "shardlab/ledger.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "shardlab/ops.hpp"

namespace shardlab {
namespace {

double fraction(ByteModel model, std::int64_t n) {
  const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  switch (model) {
    case ByteModel::one_over_n: return frac;
    case ByteModel::two_over_n: return 2.0 * frac;
    case ByteModel::whole: return 1.0;
  }
  return 1.0;
}

}  // namespace

double ring_bytes_sent(const std::string& op, std::int64_t n, double full_bytes) {
  if (n < 1) throw std::invalid_argument("[ledger] group size must be positive");
  const OpInfo& info = op_info(op, "ledger");
  if (n == 1) return 0.0;
  return fraction(info.bytes, n) * full_bytes;
}

double bus_bandwidth_factor(const std::string& op, std::int64_t n) {
  if (n < 1) throw std::invalid_argument("[ledger] group size must be positive");
  return fraction(op_info(op, "ledger").bytes, n);
}

double Ledger::total_bytes_sent() const {
  double total = 0;
  for (const auto& e : events_) total += e.bytes_sent;
  return total;
}

std::map<std::string, double> Ledger::bytes_sent_by_op() const {
  std::map<std::string, double> out;
  for (const auto& e : events_) out[e.op] += e.bytes_sent;
  return out;
}

std::map<std::string, double> Ledger::bytes_sent_by_axes() const {
  std::map<std::string, double> out;
  for (const auto& e : events_) {
    std::string key;
    for (std::size_t i = 0; i < e.axes.size(); ++i) key += (i ? "," : "") + e.axes[i];
    out[key] += e.bytes_sent;
  }
  return out;
}

std::string Ledger::table() const {
  char line[256];
  std::snprintf(line, sizeof line, "%-13s %-9s %9s %-9s %12s %12s %14s %11s\n", "op", "axes", "devices",
                "dtype", "bytes_in", "bytes_out", "bytes_sent", "seconds");
  std::string out = line;
  for (const auto& e : events_) {
    std::string axes;
    for (std::size_t i = 0; i < e.axes.size(); ++i) axes += (i ? "," : "") + e.axes[i];
    const std::string devices = std::to_string(e.group_size) + "x" + std::to_string(e.num_groups);
    char seconds[32] = "-";
    if (!std::isnan(e.seconds)) std::snprintf(seconds, sizeof seconds, "%.3e", e.seconds);
    std::snprintf(line, sizeof line, "%-13s %-9s %9s %-9s %12lld %12lld %14.0f %11s\n", e.op.c_str(),
                  axes.c_str(), devices.c_str(), dtype_name(e.dtype).c_str(),
                  static_cast<long long>(e.bytes_in), static_cast<long long>(e.bytes_out), e.bytes_sent,
                  seconds);
    out += line;
  }
  std::snprintf(line, sizeof line, "%zu events, %.0f bytes sent per device\n", events_.size(),
                total_bytes_sent());
  return out + line;
}

}  // namespace shardlab
