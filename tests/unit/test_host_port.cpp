// HOST:PORT as init_method's tcp:// and fsdpp-run's --rdzv-endpoint read it (common/host_port.h).
#include <gtest/gtest.h>

#include "common/host_port.h"

namespace fsdpp {
namespace {

TEST(HostPort, SplitsAtTheLastColonAndDropsAnIpv6AddresssBrackets) {
  auto a = split_host_port("node01:29500");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "node01");
  EXPECT_EQ(a->port, 29500);
  a = split_host_port("[::1]:1");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 1);
  a = split_host_port("[fe80::1]:65535");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "fe80::1");
}

TEST(HostPort, RefusesAMissingHostOrAPortOutsideOneTo65535) {
  for (const char* bad : {"node01", ":29500", "node01:", "node01:0", "node01:65536", "node01:295x", "node01:-1",
                          "[]:29500"})
    EXPECT_FALSE(split_host_port(bad)) << bad;
  EXPECT_EQ(parse_tcp_port("29500"), 29500);
  EXPECT_FALSE(parse_tcp_port(" 29500"));
  EXPECT_FALSE(parse_tcp_port(""));
}

}  // namespace
}  // namespace fsdpp
