// agent/stack_dump.h: finding a Python faulthandler dump in a worker's stderr lines.
#include "agent/stack_dump.h"

#include <unistd.h>

#include <catch2/catch.hpp>

using ddprun::beforeFaulthandlerDump;
using ddprun::faulthandlerDump;
using Lines = std::vector<std::string>;

TEST_CASE("stack dump: the last faulthandler dump, without the extension module list", "[agent][hang]") {
  const Lines stderrLines{"epoch 1",
                          "Fatal Python error: Aborted",  // an older dump (an earlier abort): not this one
                          "old",
                          "loss 0.3",
                          "Fatal Python error: Aborted",
                          "",
                          "Current thread 0x00007f (most recent call first):",
                          "  File \"train.py\", line 5 in wait_for_peer",
                          "",
                          "Extension modules: torch._C, numpy (total: 2)"};
  CHECK(faulthandlerDump(stderrLines) == Lines{"Fatal Python error: Aborted", "",
                                               "Current thread 0x00007f (most recent call first):",
                                               "  File \"train.py\", line 5 in wait_for_peer"});
  CHECK(beforeFaulthandlerDump(stderrLines) == Lines{"epoch 1", "Fatal Python error: Aborted", "old", "loss 0.3"});
}

TEST_CASE("stack dump: none, and a huge one is cut saying by how much", "[agent][hang]") {
  CHECK(faulthandlerDump({"a", "b"}).empty());
  CHECK(beforeFaulthandlerDump({"a", "b"}) == Lines{"a", "b"});
  Lines big{"Fatal Python error: Aborted"};
  for (int i = 0; i < 500; ++i) big.push_back("  File \"x.py\", line " + std::to_string(i) + " in f");
  auto dump = faulthandlerDump(big);
  REQUIRE(dump.size() == ddprun::kMaxStackDumpLines + 1);
  CHECK(dump.back() == "... (" + std::to_string(big.size() - ddprun::kMaxStackDumpLines) + " more lines)");
}

TEST_CASE("stack dump: only a Python interpreter is sent SIGABRT for its stack", "[agent][hang]") {
  CHECK_FALSE(ddprun::isPythonProcess(::getpid()));  // the test binary
  CHECK_FALSE(ddprun::isPythonProcess(-1));
}
