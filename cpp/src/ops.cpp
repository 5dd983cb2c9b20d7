#include "shardlab/ops.hpp"

#include <stdexcept>

namespace shardlab {
namespace {

const char* const kCollectiveNames[] = {"all_gather", "reduce_scatter", "all_reduce",
                                        "all_to_all", "ppermute",       "broadcast",
                                        "reduce",     "gather",         "scatter"};
constexpr int kNumCollectives = sizeof(kCollectiveNames) / sizeof(kCollectiveNames[0]);

std::string op_names_list() {
  std::string out;
  const auto& t = op_table();
  for (std::size_t i = 0; i < t.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == t.size() ? " or " : ", ") + std::string(t[i].name);
  }
  return out;
}

}  // namespace

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table = {
      {Op::all_gather, "all_gather", Collective::all_gather, ByteModel::one_over_n},
      {Op::psum, "psum", Collective::all_reduce, ByteModel::two_over_n},
      {Op::pmean, "pmean", Collective::all_reduce, ByteModel::two_over_n},
      {Op::pmax, "pmax", Collective::all_reduce, ByteModel::two_over_n},
      {Op::pmin, "pmin", Collective::all_reduce, ByteModel::two_over_n},
      {Op::psum_scatter, "psum_scatter", Collective::reduce_scatter, ByteModel::one_over_n},
      {Op::all_to_all, "all_to_all", Collective::all_to_all, ByteModel::one_over_n},
      {Op::ppermute, "ppermute", Collective::ppermute, ByteModel::whole},
      {Op::broadcast, "broadcast", Collective::broadcast, ByteModel::whole},
      {Op::reduce, "reduce", Collective::reduce, ByteModel::whole},
      {Op::gather, "gather", Collective::gather, ByteModel::one_over_n},
      {Op::scatter, "scatter", Collective::scatter, ByteModel::one_over_n},
  };
  return table;
}

const OpInfo& op_info(Op op) { return op_table()[static_cast<std::size_t>(op)]; }

const OpInfo& op_info(const std::string& name, const std::string& where) {
  for (const auto& info : op_table()) {
    if (name == info.name) return info;
  }
  throw std::invalid_argument("[" + where + "] unknown op '" + name + "'; the collectives are " +
                              op_names_list());
}

Op all_reduce_op(ReduceOp r) {
  switch (r) {
    case ReduceOp::sum: return Op::psum;
    case ReduceOp::max: return Op::pmax;
    case ReduceOp::min: return Op::pmin;
    case ReduceOp::mean: return Op::pmean;
  }
  return Op::psum;
}

std::string reduce_op_name(ReduceOp r) { return op_name(all_reduce_op(r)).substr(1); }

ReduceOp parse_reduce_op(const std::string& name, const std::string& where) {
  for (ReduceOp r : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::mean}) {
    if (name == reduce_op_name(r)) return r;
  }
  throw std::invalid_argument("[" + where + "] unknown reduction '" + name +
                              "'; use sum, max, min or mean");
}

std::string collective_name(Collective c) {
  const int i = static_cast<int>(c);
  return i >= 0 && i < kNumCollectives ? kCollectiveNames[i] : "?";
}

Collective parse_collective(const std::string& name) {
  for (int i = 0; i < kNumCollectives; ++i) {
    if (name == kCollectiveNames[i]) return static_cast<Collective>(i);
  }
  for (const auto& info : op_table()) {
    if (name == info.name) return info.collective;
  }
  std::string book;
  for (int i = 0; i < kNumCollectives; ++i) book += (i ? ", " : "") + std::string(kCollectiveNames[i]);
  throw std::invalid_argument("[cost] unknown collective '" + name + "': use " + book +
                              ", or an op name (" + op_names_list() + ")");
}

}  // namespace shardlab
