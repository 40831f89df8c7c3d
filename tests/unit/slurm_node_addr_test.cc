#include "launcher/scheduler/slurm_node_addr.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>

using ddprun::parseNodeAddr;

TEST_CASE("slurm: NodeAddr from scontrol show node, one line or several", "[slurm][node_addr]") {
  // Slurm 22.05's answers, abridged.
  CHECK(parseNodeAddr("NodeName=gpu01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr=10.1.2.3 "
                      "NodeHostName=gpu01 Version=22.05.8\n") == std::optional<std::string>("10.1.2.3"));
  CHECK(parseNodeAddr("NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 \n   CPUAlloc=0 CPUEfctv=2\n"
                      "   NodeAddr=gpu01-ib NodeHostName=gpu01 Version=22.05.8\n") ==
        std::optional<std::string>("gpu01-ib"));
  CHECK(parseNodeAddr("NodeName=a NodeAddr=fe80::1\n") == std::optional<std::string>("fe80::1"));
  CHECK(parseNodeAddr("NodeName=a NodeAddr=10.0.0.9") == std::optional<std::string>("10.0.0.9"));  // no newline
}

TEST_CASE("slurm: no NodeAddr, no answer", "[slurm][node_addr]") {
  CHECK_FALSE(parseNodeAddr(""));
  CHECK_FALSE(parseNodeAddr("Node nosuch not found\n"));
  CHECK_FALSE(parseNodeAddr("NodeName=a NodeAddr= NodeHostName=a\n"));
  CHECK_FALSE(parseNodeAddr("NodeName=a NodeAddr=(null)\n"));
  CHECK_FALSE(parseNodeAddr("NodeName=a MyNodeAddr=10.0.0.1\n"));  // another key that ends the same way
}
