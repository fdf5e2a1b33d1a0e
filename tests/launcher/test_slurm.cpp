// Slurm's host lists and task counts as fsdpp reads them (src/common/slurm.h), and fsdpp-run
// forming a job inside an srun step from SLURM_* alone.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "common/slurm.h"

namespace {

using fsdpp::slurm::default_port;
using fsdpp::slurm::expand_hostlist;
using fsdpp::slurm::tasks_per_node;
using Hosts = std::vector<std::string>;

TEST(SlurmHostlist, ExpandsRangesListsPaddingAndProducts) {
  EXPECT_EQ(expand_hostlist("node[01-04,07]", "L"), (Hosts{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_hostlist("a,b[8-10],c", "L"), (Hosts{"a", "b8", "b9", "b10", "c"}));
  EXPECT_EQ(expand_hostlist("gpu[098-101]-ib", "L"), (Hosts{"gpu098-ib", "gpu099-ib", "gpu100-ib", "gpu101-ib"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[3,5]", "L"), (Hosts{"rack1-n3", "rack1-n5", "rack2-n3", "rack2-n5"}));
  EXPECT_EQ(expand_hostlist("10.231.7.[1-2]", "L"), (Hosts{"10.231.7.1", "10.231.7.2"}));
  EXPECT_EQ(expand_hostlist("single", "L"), (Hosts{"single"}));
}

TEST(SlurmHostlist, RefusesMalformedListsNamingTheVariable) {
  for (const char* bad : {"node[1-", "node]1[", "node[2-1]", "node[a-b]", "a,,b", "", "node[1-99999999]",
                          "a[1-999999]b[1-999999]"}) {
    try {
      expand_hostlist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(SlurmHostlist, PortFromTheJobIdAndTasksPerNode) {
  EXPECT_EQ(default_port("123456"), 15000 + 3456);
  EXPECT_EQ(default_port("77"), 15077);
  EXPECT_EQ(default_port("4242_7"), 15000 + 4242);  // an array job's task keeps the job's port
  EXPECT_EQ(tasks_per_node("4(x2),3"), (std::vector<int>{4, 4, 3}));
  EXPECT_EQ(tasks_per_node("8"), (std::vector<int>{8}));
  EXPECT_THROW(tasks_per_node("4(x"), std::invalid_argument);
  EXPECT_THROW(tasks_per_node("x"), std::invalid_argument);
}

}  // namespace
