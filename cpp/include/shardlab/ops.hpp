// The collective ops, named once. Two vocabularies meet here:
//   Op          what a program calls, as jax.lax spells it (psum, all_gather, ...) plus the
//               MPI-style rooted collectives; ledger events carry these names.
//   Collective  the communication pattern the cost model schedules, in the book's words
//               (all_reduce, reduce_scatter, ...); psum, pmean, pmax and pmin are all one
//               all_reduce on the wire.
// Every name, the Op -> Collective map and the byte model of each op live in one table
// (ops.cpp); everything else (collectives, ledger, cost model, bindings) asks it.
#pragma once

#include <string>
#include <vector>

#include "shardlab/strided.hpp"

namespace shardlab {

enum class Op {
  all_gather,
  psum,
  pmean,
  pmax,
  pmin,
  psum_scatter,
  all_to_all,
  ppermute,
  broadcast,
  reduce,
  gather,
  scatter
};

enum class Collective {
  all_gather,
  reduce_scatter,
  all_reduce,
  all_to_all,
  ppermute,
  broadcast,
  reduce,
  gather,
  scatter
};

// How many bytes one device sends over a ring of n devices, in units of V (see ledger.hpp):
//   one_over_n  (n-1)/n V    two_over_n  2 (n-1)/n V    whole  V
enum class ByteModel { one_over_n, two_over_n, whole };

struct OpInfo {
  Op op;
  const char* name;        // "psum_scatter"
  Collective collective;   // its pattern on the wire
  ByteModel bytes;
};

// Every op, in the order of the enum.
const std::vector<OpInfo>& op_table();
const OpInfo& op_info(Op op);
// Throws std::invalid_argument naming `where` and listing the known names.
const OpInfo& op_info(const std::string& name, const std::string& where = "ledger");
inline std::string op_name(Op op) { return op_info(op).name; }

// The all-reduce op for a reduction: sum -> psum, max -> pmax, min -> pmin, mean -> pmean.
Op all_reduce_op(ReduceOp r);
// "sum", "max", "min", "mean" (the reduction's own name, without the p).
std::string reduce_op_name(ReduceOp r);
// Accepts "sum", "max", "min", "mean"; throws std::invalid_argument naming `where`.
ReduceOp parse_reduce_op(const std::string& name, const std::string& where = "reduce");

// The book's names: all_gather, reduce_scatter, all_reduce, ...
std::string collective_name(Collective c);
// Accepts the book's names and every op name (psum -> all_reduce, psum_scatter ->
// reduce_scatter, ...); throws std::invalid_argument listing both.
Collective parse_collective(const std::string& name);

}  // namespace shardlab
