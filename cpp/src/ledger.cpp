#include "shardlab/ledger.hpp"

#include <stdexcept>

namespace shardlab {
namespace {

bool is_allreduce(const std::string& op) {
  return op == "psum" || op == "pmean" || op == "pmax" || op == "pmin";
}

bool is_one_over_n(const std::string& op) {
  return op == "all_gather" || op == "psum_scatter" || op == "all_to_all" || op == "gather" ||
         op == "scatter";
}

}  // namespace

double ring_bytes_sent(const std::string& op, std::int64_t n, double full_bytes) {
  if (n < 1) throw std::invalid_argument("[ledger] group size must be positive");
  if (n == 1) return 0.0;
  const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  if (is_one_over_n(op)) return frac * full_bytes;
  if (is_allreduce(op)) return 2.0 * frac * full_bytes;
  if (op == "ppermute" || op == "broadcast" || op == "reduce") return full_bytes;
  throw std::invalid_argument("[ledger] no byte model for op '" + op + "'");
}

double bus_bandwidth_factor(const std::string& op, std::int64_t n) {
  if (n < 1) throw std::invalid_argument("[ledger] group size must be positive");
  const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  if (is_allreduce(op)) return 2.0 * frac;
  if (is_one_over_n(op)) return frac;
  if (op == "ppermute" || op == "broadcast" || op == "reduce") return 1.0;
  throw std::invalid_argument("[ledger] no bus-bandwidth factor for op '" + op + "'");
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

}  // namespace shardlab
