#include "shardlab/sharding.hpp"

#include <gtest/gtest.h>

using namespace shardlab;

TEST(NamedSharding, ShardShapeAndIndices) {
  Mesh mesh({"x", "y"}, {4, 2});
  NamedSharding s(mesh, {{"x"}, {"y"}});
  EXPECT_EQ(s.shard_shape({8, 6}), (Shape{2, 3}));
  const auto idx = s.device_indices(mesh.device_id({3, 1}), {8, 6});
  EXPECT_EQ(idx[0], (std::pair<std::int64_t, std::int64_t>{6, 8}));
  EXPECT_EQ(idx[1], (std::pair<std::int64_t, std::int64_t>{3, 6}));
}

TEST(NamedSharding, MultiAxisDimIsMajorToMinor) {
  Mesh mesh({"x", "y"}, {2, 4});
  NamedSharding yx(mesh, {{"y", "x"}});
  // device (x=1, y=2): block = y * 2 + x = 5 of 8
  const auto idx = yx.device_indices(mesh.device_id({1, 2}), {16});
  EXPECT_EQ(idx[0].first, 10);
  EXPECT_EQ(idx[0].second, 12);
}

TEST(NamedSharding, ReplicaIdsCountUnusedAxes) {
  Mesh mesh({"x", "y"}, {2, 3});
  NamedSharding s(mesh, {{"x"}});
  for (std::int64_t i = 0; i < 2; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_EQ(s.replica_id(mesh.device_id({i, j})), j);
  }
  EXPECT_FALSE(s.is_fully_replicated());
  EXPECT_TRUE(NamedSharding(mesh, {}).is_fully_replicated());
  EXPECT_EQ(s.varying(), (std::vector<bool>{true, false}));
}

TEST(NamedSharding, RejectsBadSpecs) {
  Mesh mesh({"x", "y"}, {4, 2});
  EXPECT_THROW(NamedSharding(mesh, {{"x"}, {"x"}}), DuplicateSpecError);
  EXPECT_THROW(NamedSharding(mesh, {{"x", "x"}}), DuplicateSpecError);
  EXPECT_THROW(NamedSharding(mesh, {{"z"}}), std::invalid_argument);
  NamedSharding s(mesh, {{"x"}, {}, {"y"}});
  EXPECT_THROW(s.check_shape({8, 2}, "device_put"), std::invalid_argument);  // spec longer than rank
  try {
    NamedSharding(mesh, {{"x", "y"}}).check_shape({12}, "device_put");
    FAIL();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[device_put]"), std::string::npos);
    EXPECT_NE(msg.find("not divisible by 8"), std::string::npos);
  }
}
