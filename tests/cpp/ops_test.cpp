// The one table of collective ops: complete, in enum order, and the only source the ledger's
// byte model, the cost model's parser and the collectives' event names read.
#include "shardlab/ops.hpp"

#include <gtest/gtest.h>

#include <set>

#include "shardlab/collectives.hpp"
#include "shardlab/ledger.hpp"

using namespace shardlab;

TEST(Ops, TableIsInEnumOrderWithUniqueNames) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < op_table().size(); ++i) {
    const OpInfo& info = op_table()[i];
    EXPECT_EQ(static_cast<std::size_t>(info.op), i) << info.name;
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    EXPECT_EQ(&op_info(info.name), &info);
    EXPECT_EQ(parse_collective(info.name), info.collective) << info.name;
  }
  EXPECT_EQ(names.size(), static_cast<std::size_t>(Op::scatter) + 1);
}

TEST(Ops, LedgerByteModelFollowsTheTable) {
  for (const OpInfo& info : op_table()) {
    const double want = info.bytes == ByteModel::one_over_n ? 0.75 : info.bytes == ByteModel::two_over_n ? 1.5 : 1.0;
    EXPECT_DOUBLE_EQ(ring_bytes_sent(info.name, 4, 1.0), want) << info.name;
    EXPECT_DOUBLE_EQ(bus_bandwidth_factor(info.name, 4), want) << info.name;
  }
  try {
    ring_bytes_sent("all_reduce", 4, 1.0);  // the book's name is a Collective, not a program op
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[ledger] unknown op 'all_reduce'; the collectives are all_gather, psum"),
              std::string::npos)
        << e.what();
  }
}

TEST(Ops, CollectiveNamesRoundTripAndReductions) {
  for (Collective c : {Collective::all_gather, Collective::reduce_scatter, Collective::all_reduce,
                       Collective::all_to_all, Collective::ppermute, Collective::broadcast, Collective::reduce,
                       Collective::gather, Collective::scatter}) {
    EXPECT_EQ(parse_collective(collective_name(c)), c);
  }
  EXPECT_EQ(parse_collective("psum_scatter"), Collective::reduce_scatter);
  EXPECT_EQ(parse_collective("pmean"), Collective::all_reduce);
  EXPECT_THROW(parse_collective("all_scatter"), std::invalid_argument);
  for (ReduceOp r : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::mean}) {
    EXPECT_EQ(parse_reduce_op(reduce_op_name(r)), r);
    EXPECT_EQ(op_info(all_reduce_op(r)).collective, Collective::all_reduce);
  }
  EXPECT_EQ(op_name(all_reduce_op(ReduceOp::mean)), "pmean");
  EXPECT_THROW(parse_reduce_op("prod"), std::invalid_argument);
}

TEST(Ops, CollectivesNameTheirEventsFromTheTable) {
  const Mesh mesh({"x"}, {2});
  float in[2] = {1.0f, 2.0f}, out[1] = {0.0f};
  const ArrayRef i{in, DType::float32, {2, 1}, {4, 4}};
  const ArrayRef o{out, DType::float32, {1, 1}, {0, 4}};
  EXPECT_EQ(all_reduce(mesh, i, o, {"x"}, ReduceOp::max).op, op_name(Op::pmax));
  EXPECT_EQ(out[0], 2.0f);
}
