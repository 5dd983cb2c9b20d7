#include "shardlab/mesh.hpp"

#include <gtest/gtest.h>

using shardlab::Mesh;

TEST(Mesh, RowMajorDeviceIds) {
  Mesh mesh({"x", "y"}, {4, 2});
  EXPECT_EQ(mesh.size(), 8);
  for (std::int64_t i = 0; i < 4; ++i) {
    for (std::int64_t j = 0; j < 2; ++j) {
      EXPECT_EQ(mesh.device_id({i, j}), 2 * i + j);
      EXPECT_EQ(mesh.coords(2 * i + j), (std::vector<std::int64_t>{i, j}));
    }
  }
}

TEST(Mesh, GroupsAlongOneAxis) {
  Mesh mesh({"x", "y"}, {4, 2});
  const auto g = mesh.groups({0});  // along x: one group per y
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0], (std::vector<std::int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(g[1], (std::vector<std::int64_t>{1, 3, 5, 7}));
}

TEST(Mesh, GroupsFollowGivenAxisOrder) {
  Mesh mesh({"x", "y", "z"}, {2, 2, 2});
  const auto yx = mesh.groups({1, 0});  // y major, x minor
  ASSERT_EQ(yx.size(), 2u);
  EXPECT_EQ(yx[0], (std::vector<std::int64_t>{0, 4, 2, 6}));
  const auto xy = mesh.groups({0, 1});
  EXPECT_EQ(xy[1], (std::vector<std::int64_t>{1, 3, 5, 7}));
}

TEST(Mesh, RejectsBadInput) {
  EXPECT_THROW(Mesh({"x", "x"}, {2, 2}), std::invalid_argument);
  EXPECT_THROW(Mesh({"x"}, {0}), std::invalid_argument);
  EXPECT_THROW(Mesh({"x"}, {-3}), std::invalid_argument);
  EXPECT_THROW(Mesh({}, {}), std::invalid_argument);
  EXPECT_THROW(Mesh({"x", "y"}, {2}), std::invalid_argument);
  Mesh mesh({"x"}, {4});
  EXPECT_THROW(mesh.device_id({4}), std::invalid_argument);
  EXPECT_THROW(mesh.coords(4), std::invalid_argument);
  try {
    mesh.axis_index("z", "psum");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[psum] unknown mesh axis 'z'"), std::string::npos);
  }
  EXPECT_THROW(shardlab::resolve_axes(mesh, {"x", "x"}, "psum"), std::invalid_argument);
}
