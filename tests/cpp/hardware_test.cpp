#include "shardlab/hardware.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace shardlab {
namespace {

TEST(Hardware, EveryPresetHasComputeMemoryAndInterconnect) {
  ASSERT_EQ(hardware_presets().size(), 8u);
  for (const auto& h : hardware_presets()) {
    EXPECT_GT(h.peak("bfloat16"), 0) << h.name;
    EXPECT_GT(h.peak("int8"), 0) << h.name;
    EXPECT_GT(h.hbm_capacity, 0) << h.name;
    EXPECT_GT(h.hbm_bandwidth, 0) << h.name;
    EXPECT_GT(h.hop_latency, 0) << h.name;
    if (h.family == "tpu") {
      EXPECT_GT(h.ici_link_bandwidth, 0) << h.name;
      EXPECT_GT(h.dcn_bandwidth, 0) << h.name;
      EXPECT_EQ(h.ici_links_per_axis, 2) << h.name;
    } else {
      EXPECT_EQ(h.node_size, 8) << h.name;
      EXPECT_GT(h.nvlink_bandwidth(), h.ib_bandwidth) << h.name;
    }
  }
}

TEST(Hardware, A100HasTwelveNvlinkLinksAndSelenesInfiniband) {
  const Hardware& a100 = get_hardware("nvidia-a100");
  EXPECT_EQ(a100.nvlink_links, 12);
  EXPECT_DOUBLE_EQ(a100.nvlink_link_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(a100.ib_bandwidth, 25e9);  // 8 x 200 Gb/s HDR per 8-GPU node
  EXPECT_DOUBLE_EQ(a100.peak("bfloat16"), 312e12);
  EXPECT_EQ(get_hardware("h100").nvlink_links, 18);
}

TEST(Hardware, CriticalIntensityOfV5eIsAbout240) {
  const auto& v5e = get_hardware("tpu-v5e");
  const double intensity = v5e.peak("bfloat16") / v5e.hbm_bandwidth;
  EXPECT_NEAR(intensity, 240.0, 1.0);
}

TEST(Hardware, WraparoundRules) {
  const auto& v5e = get_hardware("tpu-v5e");
  EXPECT_TRUE(v5e.wraps(16));
  EXPECT_FALSE(v5e.wraps(8));
  EXPECT_FALSE(v5e.wraps(4));
  const auto& v4p = get_hardware("tpu-v4p");
  EXPECT_TRUE(v4p.wraps(4));
  EXPECT_TRUE(v4p.wraps(16));
  EXPECT_FALSE(v4p.wraps(2));
  EXPECT_FALSE(v4p.wraps(6));
  EXPECT_EQ(get_hardware("tpu-v5p").ici_axes.size(), 3u);
  EXPECT_EQ(get_hardware("tpu-v6e").ici_axes.size(), 2u);
}

TEST(Hardware, NameAliases) {
  EXPECT_EQ(get_hardware("v5e").name, "tpu-v5e");
  EXPECT_EQ(get_hardware("TPU_V5P").name, "tpu-v5p");
  EXPECT_EQ(get_hardware("H100").name, "h100");
  EXPECT_EQ(get_hardware("nvidia-b200").name, "b200");
}

TEST(Hardware, UnknownPresetListsKnownOnes) {
  try {
    get_hardware("tpu-v9");
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tpu-v9"), std::string::npos);
    for (const auto& n : hardware_names()) EXPECT_NE(msg.find(n), std::string::npos) << n;
  }
}

TEST(Hardware, MissingDtypeNamesKnownDtypes) {
  try {
    get_hardware("tpu-v5e").peak("float32");
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos);
  }
}

TEST(Hardware, ParseTopology) {
  EXPECT_EQ(parse_topology("ring"), Topology::ring);
  EXPECT_EQ(parse_topology("uni_ring"), Topology::uni_ring);
  EXPECT_EQ(parse_topology("line"), Topology::line);
  EXPECT_EQ(parse_topology("switch"), Topology::switched);
  EXPECT_THROW(parse_topology("mesh"), std::invalid_argument);
}

}  // namespace
}  // namespace shardlab
