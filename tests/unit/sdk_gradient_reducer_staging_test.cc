// GradientReducer on a communicator whose collectives need device memory (nccl's case), without a
// GPU: a fake communicator reports device memory, hands out staging buffers that are host memory
// recording every copy, and runs its collectives on a real gloo communicator (N ranks as N
// threads), refusing any buffer that is not one of its staging buffers, as NCCL would fault on
// a host pointer. Copies in are applied lazily, at the next collective or copy out, as a CUDA
// stream runs them, and a copy out while a collective is in flight fails: a reducer that got the
// order wrong gives wrong values or fails here.
#include <catch2/catch.hpp>

#include <cstring>
#include <exception>
#include <map>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/gradient_reducer.h"
#include "worker_sdk/in_process_store.h"
#include "tests/support/sdk_ranks.h"
#include "worker_sdk/work_state.h"

using namespace std::chrono_literals;

namespace {

class FakeDeviceCommunicator;

// Host memory standing in for device memory; its copies are the fake's stream operations.
class FakeStagingBuffer final : public ddp::StagingBuffer {
 public:
  FakeStagingBuffer(FakeDeviceCommunicator& comm, std::size_t bytes);
  ~FakeStagingBuffer() override;
  void* data() override { return bytes_.data(); }
  void applyPendingCopies();

 protected:
  void doCopyFromHost(const void* src, std::size_t bytes, std::size_t offset) override;
  void doCopyToHost(void* dst, std::size_t bytes, std::size_t offset) override;

 private:
  struct PendingCopy {
    const void* src;
    std::size_t bytes, offset;
  };
  FakeDeviceCommunicator& comm_;
  std::vector<std::byte> bytes_;
  std::vector<PendingCopy> pending_;
};

class FakeDeviceCommunicator final : public ddp::Communicator {
 public:
  explicit FakeDeviceCommunicator(ddp::Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  ddp::Backend backend() const override { return ddp::Backend::kNccl; }
  ddp::MemoryKind memoryKind() const override { return ddp::MemoryKind::kDevice; }
  std::unique_ptr<ddp::StagingBuffer> makeStagingBuffer(std::size_t bytes) override {
    ++buffersMade;
    return std::make_unique<FakeStagingBuffer>(*this, bytes);
  }
  void abort() override { inner_.abort(); }

  // What the reducer did, and the failures to inject.
  int buffersMade = 0;
  int copiesIn = 0, copiesOut = 0;
  std::size_t bytesIn = 0, bytesOut = 0;
  std::vector<int> allReduceBuffers;  // index (in making order) of each all-reduce's buffer
  bool failCopyIn = false, failCopyOut = false, failAllReduce = false;

  std::map<const void*, FakeStagingBuffer*> live;  // data() -> buffer
  std::map<const void*, int> order;                // data() -> making order
  std::vector<ddp::Work> issued;

 protected:
  ddp::Work startAllReduce(const void* send, void* recv, std::size_t count, ddp::DataType type,
                           ddp::ReduceOp op) override {
    staged(send, count * ddp::elementSize(type));
    staged(recv, count * ddp::elementSize(type));
    allReduceBuffers.push_back(order.at(send));
    // A stream runs the copies enqueued before the collective first.
    for (auto& [data, b] : live) b->applyPendingCopies();
    if (failAllReduce) {
      auto state = std::make_shared<ddp::detail::PromiseWork>();
      state->complete(std::make_exception_ptr(ddprun::ConnectionError("fake: peer closed the connection")));
      issued.emplace_back(state);
    } else {
      issued.push_back(inner_.allReduceAsync(send, recv, count, type, op));
    }
    return issued.back();
  }
  ddp::Work startBroadcast(const void*, void*, std::size_t, ddp::DataType, int) override { return refuse(); }
  ddp::Work startAllGather(const void*, void*, std::size_t, ddp::DataType) override { return refuse(); }
  ddp::Work startReduceScatter(const void*, void*, std::size_t, ddp::DataType, ddp::ReduceOp) override {
    return refuse();
  }
  ddp::Work startBarrier() override { return inner_.barrierAsync(); }

 private:
  void staged(const void* p, std::size_t bytes) const {
    auto it = live.find(p);
    if (it == live.end() || bytes > it->second->size()) {
      throw std::logic_error("fake device: a collective on memory that is not a staging buffer");
    }
  }
  static ddp::Work refuse() { throw std::logic_error("fake device: the reducer asked for an unexpected collective"); }

  ddp::Communicator& inner_;
};

FakeStagingBuffer::FakeStagingBuffer(FakeDeviceCommunicator& comm, std::size_t bytes)
    : StagingBuffer(bytes), comm_(comm), bytes_(bytes) {
  comm_.order[data()] = static_cast<int>(comm_.order.size());
  comm_.live[data()] = this;
}

FakeStagingBuffer::~FakeStagingBuffer() { comm_.live.erase(bytes_.data()); }

void FakeStagingBuffer::applyPendingCopies() {
  for (const PendingCopy& c : pending_) std::memcpy(bytes_.data() + c.offset, c.src, c.bytes);
  pending_.clear();
}

void FakeStagingBuffer::doCopyFromHost(const void* src, std::size_t bytes, std::size_t offset) {
  if (comm_.failCopyIn) throw ddprun::Error("fake: cudaMemcpyAsync: an illegal memory access was encountered");
  ++comm_.copiesIn;
  comm_.bytesIn += bytes;
  pending_.push_back(PendingCopy{src, bytes, offset});
}

void FakeStagingBuffer::doCopyToHost(void* dst, std::size_t bytes, std::size_t offset) {
  if (comm_.failCopyOut) throw ddprun::Error("fake: cudaStreamSynchronize: unspecified launch failure");
  // The contract: wait for the collectives first (the copy itself has no timeout).
  for (const ddp::Work& w : comm_.issued) {
    if (!w.isCompleted()) throw std::logic_error("fake device: copy out while a collective is in flight");
  }
  applyPendingCopies();
  ++comm_.copiesOut;
  comm_.bytesOut += bytes;
  std::memcpy(dst, bytes_.data() + offset, bytes);
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& grads) {
  std::vector<std::span<float>> out;
  for (auto& g : grads) out.emplace_back(g);
  return out;
}

float gradValue(int r, std::size_t g, std::size_t i, int step) {
  return static_cast<float>(r * 10 + g) + 0.25f * static_cast<float>(i) + static_cast<float>(step);
}

const std::vector<std::size_t> kSizes{7, 1, 300, 12, 5};

std::vector<std::vector<float>> makeGrads() {
  std::vector<std::vector<float>> grads;
  for (std::size_t n : kSizes) grads.emplace_back(n);
  return grads;
}

void fill(std::vector<std::vector<float>>& grads, int r, int step) {
  for (std::size_t g = 0; g < grads.size(); ++g) {
    for (std::size_t i = 0; i < grads[g].size(); ++i) grads[g][i] = gradValue(r, g, i, step);
  }
}

// One backward pass, last gradient first, then finish().
void backward(ddp::GradientReducer& reducer, std::vector<std::vector<float>>& grads, int r, int step) {
  fill(grads, r, step);
  for (std::size_t g = grads.size(); g-- > 0;) reducer.markReady(g);
  reducer.finish();
}

// A world of one on the test's own thread (Catch2's assertions are not thread-safe).
std::unique_ptr<ddp::Communicator> soloGloo(ddp::InProcessStore& store) {
  ddp::CommunicatorOptions options;
  options.timeout = 30s;
  return ddp::makeCommunicator(ddp::Backend::kGloo, ddp::test::rankEnv(0, 1), store, options);
}

}  // namespace

TEST_CASE("GradientReducer on device memory: same averages as the host path, through staging buffers",
          "[sdk][reducer]") {
  const int size = GENERATE(1, 2, 3);
  std::vector<std::vector<std::vector<float>>> staged(static_cast<std::size_t>(size)), host(staged);
  const auto n = static_cast<std::size_t>(size);
  std::vector<int> copiesIn(n), copiesOut(n), buffers(n);
  std::vector<std::size_t> buckets(n);
  ddp::test::runGlooRanks(size, [&](ddp::Communicator& gloo) {
    const int r = gloo.rank();
    const auto ri = static_cast<std::size_t>(r);
    FakeDeviceCommunicator device(gloo);
    auto viaDevice = makeGrads();
    auto viaHost = makeGrads();
    // Small buckets: several of them, with boundaries inside the list. Both reducers see the same
    // collectives in the same order on every rank.
    ddp::GradientReducer deviceReducer(device, spans(viaDevice), ddp::GradientReducerOptions{64});
    ddp::GradientReducer hostReducer(gloo, spans(viaHost), ddp::GradientReducerOptions{64});
    for (int step = 0; step < 2; ++step) {
      backward(deviceReducer, viaDevice, r, step);
      backward(hostReducer, viaHost, r, step);
    }
    staged[ri] = viaDevice;
    host[ri] = viaHost;
    copiesIn[ri] = device.copiesIn;
    copiesOut[ri] = device.copiesOut;
    buffers[ri] = device.buffersMade;
    buckets[ri] = deviceReducer.bucketCount();
  });
  for (int r = 0; r < size; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    INFO("rank " << r);
    CHECK(staged[ri] == host[ri]);  // bit for bit
    for (std::size_t g = 0; g < kSizes.size(); ++g) {
      for (std::size_t i = 0; i < kSizes[g]; ++i) {
        float mean = 0;
        for (int q = 0; q < size; ++q) mean += gradValue(q, g, i, 1);
        mean /= static_cast<float>(size);
        CHECK(staged[ri][g][i] == Approx(mean).epsilon(1e-6));
      }
    }
    CHECK(buckets[ri] > 1);
    CHECK(buffers[ri] == static_cast<int>(buckets[ri]));          // one staging buffer per bucket, made once
    CHECK(copiesIn[ri] == 2 * static_cast<int>(kSizes.size()));   // every gradient in, every step
    CHECK(copiesOut[ri] == 2 * static_cast<int>(kSizes.size()));  // and back
  }
}

TEST_CASE("GradientReducer on device memory: a gradient is copied in when marked, buckets start in order",
          "[sdk][reducer]") {
  ddp::InProcessStore store;
  auto solo = soloGloo(store);
  ddp::Communicator& gloo = *solo;
  FakeDeviceCommunicator device(gloo);
  std::vector<std::vector<float>> grads{std::vector<float>(3, 1.0f), std::vector<float>(5, 2.0f),
                                        std::vector<float>(2, 3.0f), std::vector<float>(4, 4.0f)};
  // Buckets {3, 2} and {1, 0}, as in the host tests.
  ddp::GradientReducer reducer(device, spans(grads), ddp::GradientReducerOptions{6 * sizeof(float)});
  REQUIRE(reducer.bucketCount() == 2);
  REQUIRE(device.buffersMade == 2);
  reducer.markReady(1);
  CHECK(device.copiesIn == 1);
  CHECK(device.bytesIn == 5 * sizeof(float));
  reducer.markReady(0);  // bucket 1 complete, but bucket 0 must go first
  CHECK(device.allReduceBuffers.empty());
  reducer.markReady(3);
  reducer.markReady(2);
  CHECK(device.allReduceBuffers == std::vector<int>{0, 1});  // each bucket on its own buffer, in order
  CHECK(device.copiesOut == 0);                              // nothing back before finish()
  reducer.finish();
  CHECK(device.copiesOut == 4);
  CHECK(device.bytesOut == 14 * sizeof(float));
  CHECK(grads[1] == std::vector<float>(5, 2.0f));  // a world of one: the mean is the value
  CHECK(grads[3] == std::vector<float>(4, 4.0f));
}

TEST_CASE("GradientReducer on device memory: noSync copies and communicates nothing", "[sdk][reducer]") {
  constexpr int kSize = 2;
  std::vector<std::vector<float>> afterNoSync(kSize), afterSync(kSize);
  ddp::test::runGlooRanks(kSize, [&](ddp::Communicator& gloo) {
    const int r = gloo.rank();
    FakeDeviceCommunicator device(gloo);
    std::vector<std::vector<float>> grads{std::vector<float>(4, 0.0f)};
    ddp::GradientReducer reducer(device, spans(grads));
    {
      auto guard = reducer.noSync();
      for (float& v : grads[0]) v += static_cast<float>(r + 1);
      reducer.markReady(0);
      reducer.finish();
      if (device.copiesIn != 0 || device.copiesOut != 0 || !device.allReduceBuffers.empty()) {
        throw std::runtime_error("noSync touched the device");
      }
      afterNoSync[static_cast<std::size_t>(r)] = grads[0];
    }
    for (float& v : grads[0]) v += static_cast<float>(10 * (r + 1));
    reducer.markReady(0);
    reducer.finish();
    afterSync[static_cast<std::size_t>(r)] = grads[0];
  });
  CHECK(afterNoSync[0] == std::vector<float>(4, 1.0f));
  CHECK(afterNoSync[1] == std::vector<float>(4, 2.0f));
  CHECK(afterSync[0] == std::vector<float>(4, 16.5f));  // mean of the accumulated sums (11 + 22) / 2
  CHECK(afterSync[1] == std::vector<float>(4, 16.5f));
}

TEST_CASE("GradientReducer on device memory: copy and collective errors reach the caller", "[sdk][reducer]") {
  ddp::InProcessStore store;
  auto solo = soloGloo(store);
  ddp::Communicator& gloo = *solo;
  FakeDeviceCommunicator device(gloo);
  std::vector<std::vector<float>> grads{std::vector<float>(2, 1.0f), std::vector<float>(3, 2.0f)};
  ddp::GradientReducer reducer(device, spans(grads), ddp::GradientReducerOptions{sizeof(float)});

  device.failCopyIn = true;
  CHECK_THROWS_WITH(reducer.markReady(1), Catch::Matchers::Contains("illegal memory access"));
  device.failCopyIn = false;
  reducer.finish();  // takes both as ready again: the failed mark did not count

  device.failAllReduce = true;
  for (float& v : grads[0]) v = 5.0f;
  CHECK_THROWS_AS(reducer.finish(), ddprun::ConnectionError);
  CHECK(grads[0] == std::vector<float>(2, 5.0f));  // nothing copied back from a failed collective
  device.failAllReduce = false;

  const int out = device.copiesOut;
  device.failCopyOut = true;
  CHECK_THROWS_WITH(reducer.finish(), Catch::Matchers::Contains("unspecified launch failure"));
  CHECK(device.copiesOut == out);
  device.failCopyOut = false;
  reducer.finish();  // the next step works again
}

TEST_CASE("Communicator::allReduceHost stages host values on a device communicator", "[sdk][reducer]") {
  ddp::test::runGlooRanks(2, [](ddp::Communicator& gloo) {
    FakeDeviceCommunicator device(gloo);
    double totals[2] = {1.5 * (gloo.rank() + 1), 1.0};
    device.allReduceHost(std::span<double>(totals), ddp::ReduceOp::kSum);
    if (totals[0] != 4.5 || totals[1] != 2.0) throw std::runtime_error("wrong sum");
    if (device.copiesIn != 1 || device.copiesOut != 1) throw std::runtime_error("not staged");
    // A host communicator all-reduces in place, with no staging.
    double direct[1] = {1.0};
    gloo.allReduceHost(std::span<double>(direct), ddp::ReduceOp::kSum);
    if (direct[0] != 2.0) throw std::runtime_error("wrong direct sum");
  });
}

TEST_CASE("StagingBuffer: the default is host memory, and copies outside it are refused", "[sdk][reducer]") {
  ddp::InProcessStore store;
  auto solo = soloGloo(store);
  ddp::Communicator& gloo = *solo;
  CHECK(gloo.memoryKind() == ddp::MemoryKind::kHost);
  auto buffer = gloo.makeStagingBuffer(16);
  CHECK(buffer->size() == 16);
  const float in[4] = {1, 2, 3, 4};
  buffer->copyFromHost(in, sizeof(in), 0);
  CHECK(static_cast<float*>(buffer->data())[2] == 3.0f);  // host memory: readable in place
  float out[2] = {};
  buffer->copyToHost(out, sizeof(out), 8);
  CHECK(out[0] == 3.0f);
  CHECK(out[1] == 4.0f);
  CHECK_THROWS_AS(buffer->copyFromHost(in, sizeof(in), 4), ddprun::ConfigError);
  CHECK_THROWS_AS(buffer->copyToHost(out, 1, 17), ddprun::ConfigError);
  CHECK_THROWS_AS(buffer->copyToHost(nullptr, 4, 0), ddprun::ConfigError);
  buffer->copyToHost(nullptr, 0, 16);  // empty: nothing to do
}
