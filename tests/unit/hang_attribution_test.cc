// agent/hang_attribution.h: libddp's flight recorder written and read back, and the line that
// names the rank that is behind.
#include "agent/hang_attribution.h"

#include <catch2/catch.hpp>

#include "test_util.h"
#include "worker_sdk/flight_recorder.h"

using ddprun::attributeHang;
using ddprun::CollectiveRecord;
using ddprun::RankCollectives;

namespace {

RankCollectives rankWith(int rank, uint64_t last, bool completed) {
  RankCollectives r{rank, {}};
  for (uint64_t seq = last > 2 ? last - 2 : 1; seq <= last; ++seq) {
    r.records.push_back(CollectiveRecord{seq, "all_reduce", 4096, seq < last || completed, false});
  }
  return r;
}

}  // namespace

TEST_CASE("flight recorder: what libddp writes the agent reads, the last 64 kept", "[agent][hang]") {
  ddprun::test::TempDir dir;
  const std::string path = dir.path() + "/flight_recorder";
  ddp::detail::FlightRecorder recorder(path, 3);
  REQUIRE(recorder.enabled());
  for (int i = 0; i < 70; ++i) {
    uint64_t seq = recorder.started(i % 2 ? "broadcast" : "all_reduce", 1000 + i);
    if (i < 69) recorder.finished(seq, i != 68);
  }
  auto records = ddprun::readFlightRecorder(path);
  REQUIRE(records);
  REQUIRE(records->size() == 64);
  CHECK(records->front().seq == 7);
  CHECK(records->back().seq == 70);
  CHECK(records->back().op == "broadcast");
  CHECK(records->back().bytes == 1069);
  CHECK_FALSE(records->back().completed);
  CHECK((*records)[62].failed);  // #69
  CHECK((*records)[61].completed);

  CHECK_FALSE(ddprun::readFlightRecorder(dir.path() + "/absent"));
  CHECK_FALSE(ddprun::readFlightRecorder("/etc/hostname"));  // not a recorder: no crash, no records
}

TEST_CASE("attribution: the rank that never started the collective the others wait in", "[agent][hang]") {
  auto found = attributeHang({rankWith(0, 1025, false), rankWith(1, 1025, false), rankWith(2, 1024, true),
                              rankWith(3, 1025, false)});
  CHECK(found.line == "rank 2 never started all_reduce #1025 (its last: all_reduce #1024, completed); "
                      "ranks 0, 1, 3 wait in it");
  CHECK(found.behind == std::vector<int>{2});

  found = attributeHang({rankWith(0, 9, false), RankCollectives{1, {}}, rankWith(2, 8, false)});
  CHECK(found.line == "ranks 1, 2 never started all_reduce #9; rank 0 waits in it");
  CHECK(found.behind == std::vector<int>{1, 2});
}

TEST_CASE("attribution: all in it, all done, or nothing recorded", "[agent][hang]") {
  auto found = attributeHang({rankWith(0, 5, false), rankWith(1, 5, false)});
  CHECK(found.line == "ranks 0, 1 are all in all_reduce #5 and none of them completed it: the rank holding it "
                      "back is on another node, or the transport is stuck");
  CHECK(found.behind.empty());
  found = attributeHang({rankWith(0, 5, true), rankWith(1, 5, true)});
  CHECK(found.line == "every rank here completed its last collective (all_reduce #5): the hang is outside "
                      "communication");
  CHECK(attributeHang({RankCollectives{0, {}}}).line.empty());
  CHECK(ddprun::describeRecent(rankWith(0, 5, false), 2) ==
        "rank 0: #4 all_reduce 4.0 KB completed, #5 all_reduce 4.0 KB started");
}

TEST_CASE("stacks: the one rank outside torch.distributed while the others wait in it is behind", "[agent][hang]") {
  using ddprun::attributeFromStacks;
  using ddprun::RankStackLines;
  const std::vector<std::string> waiting = {
      "Thread 0x00007f0000000000 (most recent call first):",
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1436 in all_reduce",
      "  File \"/tmp/train.py\", line 12 in <module>"};
  const std::vector<std::string> sleeping = {"Thread 0x00007f0000000001 (most recent call first):",
                                             "  File \"/tmp/train.py\", line 8 in load_batch",
                                             "  File \"/tmp/train.py\", line 11 in <module>"};
  const std::vector<std::string> inDdp = {
      "  File \"/usr/lib/python3/dist-packages/torch/nn/parallel/distributed.py\", line 1040 in forward"};

  auto one = attributeFromStacks({{0, waiting}, {1, sleeping}, {2, inDdp}});
  CHECK(one.behind == std::vector<int>{1});
  CHECK(one.line == "rank 1 is outside every torch.distributed call while ranks 0, 2 wait in one: rank 1 is the one behind");
  // Nothing to tell: all wait (the one behind is on another node), two outside (NCCL: both in
  // their own code), no dump at all, or the only dump outside with none waiting.
  CHECK(attributeFromStacks({{0, waiting}, {1, waiting}}).line.empty());
  CHECK(attributeFromStacks({{0, sleeping}, {1, sleeping}, {2, waiting}}).behind.empty());
  CHECK(attributeFromStacks({{0, {}}, {1, sleeping}}).line.empty());
  CHECK(attributeFromStacks({}).line.empty());
  // A rank without a dump neither waits nor is behind.
  CHECK(attributeFromStacks({{0, waiting}, {1, {}}, {2, sleeping}}).behind == std::vector<int>{2});
}
