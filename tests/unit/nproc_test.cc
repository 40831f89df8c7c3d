#include "launcher/nproc.h"

#include <catch2/catch.hpp>

#include "common/error.h"

using ddprun::ConfigError;
using ddprun::DeviceCounts;
using ddprun::resolveNprocPerNode;

namespace {

// Counts that also record whether anyone asked.
struct FakeCounts {
  int gpus = 0;
  int cpus = 0;
  int gpuQueries = 0;
  int cpuQueries = 0;
  int xpus = 0;
  bool xpusChosen = false;

  DeviceCounts counts() {
    return DeviceCounts{[this] {
                          ++gpuQueries;
                          return gpus;
                        },
                        [this] {
                          ++cpuQueries;
                          return cpus;
                        },
                        [this] { return xpus; }, [this] { return xpusChosen; }};
  }
};

}  // namespace

TEST_CASE("nproc_per_node takes numbers from 1 to 1024", "[cli]") {
  FakeCounts fake{4, 16};
  CHECK(resolveNprocPerNode("1", fake.counts()) == 1);
  CHECK(resolveNprocPerNode("8", fake.counts()) == 8);
  CHECK(resolveNprocPerNode("1024", fake.counts()) == 1024);
  CHECK(fake.gpuQueries == 0);  // a number needs no device count
  CHECK(fake.cpuQueries == 0);
}

TEST_CASE("nproc_per_node rejects numbers out of range and non-numbers", "[cli]") {
  FakeCounts fake{4, 16};
  for (const char* bad : {"0", "-1", "1025", "99999999999999999999", "abc", "", "4x", "2.0", "GPU"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_AS(resolveNprocPerNode(bad, fake.counts()), ConfigError);
  }
  CHECK_THROWS_WITH(resolveNprocPerNode("1025", fake.counts()), Catch::Contains("1024"));
  CHECK_THROWS_WITH(resolveNprocPerNode("abc", fake.counts()), Catch::Contains("abc"));
}

TEST_CASE("nproc_per_node=cpu counts CPUs", "[cli]") {
  FakeCounts fake{4, 16};
  CHECK(resolveNprocPerNode("cpu", fake.counts()) == 16);
}

TEST_CASE("nproc_per_node=gpu counts GPUs and fails without any", "[cli]") {
  FakeCounts withGpus{4, 16};
  CHECK(resolveNprocPerNode("gpu", withGpus.counts()) == 4);
  FakeCounts noGpus{0, 16};
  CHECK_THROWS_AS(resolveNprocPerNode("gpu", noGpus.counts()), ConfigError);
}

TEST_CASE("nproc_per_node=auto prefers GPUs, then CPUs", "[cli]") {
  FakeCounts withGpus{2, 16};
  CHECK(resolveNprocPerNode("auto", withGpus.counts()) == 2);
  FakeCounts noGpus{0, 16};
  CHECK(resolveNprocPerNode("auto", noGpus.counts()) == 16);
}

TEST_CASE("nproc_per_node=auto counts Intel GPUs that ZE_AFFINITY_MASK names, never an unnamed one", "[cli]") {
  // torch 2.x's auto is its accelerator's count (test_run.py's xpu case: 3 XPUs, auto is 3).
  FakeCounts named{0, 16};
  named.xpus = 3;
  named.xpusChosen = true;
  CHECK(resolveNprocPerNode("auto", named.counts()) == 3);
  named.gpus = 2;  // CUDA first
  CHECK(resolveNprocPerNode("auto", named.counts()) == 2);
  FakeCounts integrated{0, 16};  // a render node nobody asked for: a CUDA-built torch would count CPUs
  integrated.xpus = 1;
  CHECK(resolveNprocPerNode("auto", integrated.counts()) == 16);
}

TEST_CASE("nproc_per_node=xpu counts Intel GPUs, and none is an error, as torchrun's", "[cli]") {
  FakeCounts fake{4, 16};
  fake.xpus = 2;
  CHECK(resolveNprocPerNode("xpu", fake.counts()) == 2);
  fake.xpus = 0;
  CHECK_THROWS_WITH(resolveNprocPerNode("xpu", fake.counts()), Catch::Contains("no Intel GPU (XPU)"));
  CHECK_THROWS_WITH(resolveNprocPerNode("tpu", fake.counts()), Catch::Contains("cpu, gpu or xpu"));
}
