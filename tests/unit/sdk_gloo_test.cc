// The gloo communicator: every collective, op and element type for world sizes 1 to 4, checked
// against a float64 reference computed here; asynchronous handles; errors and timeouts. N ranks
// are N threads over one InProcessStore, talking gloo's TCP over loopback (as gloo's own tests).
// Catch2 is not thread-safe: the ranks record their results, the main thread checks them.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/in_process_store.h"
#include "worker_sdk/source_address.h"
#include "safety_bound.h"
#include "tests/support/sdk_ranks.h"

using Catch::Matchers::Contains;
using ddp::DataType;
using ddp::ReduceOp;
using namespace std::chrono_literals;
using ddp::test::rankEnv;
using ddp::test::testOptions;

namespace {

constexpr std::size_t kCount = 13;  // elements per all-reduce and broadcast
constexpr std::size_t kBlock = 5;   // elements per rank in all-gather and reduce-scatter
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

// The input of rank r at element i: small integers, negative too, exact in every type.
double input(int rank, std::size_t i) { return static_cast<double>(static_cast<int>((i * 7 + rank * 3) % 9) - 4 + rank); }

template <typename T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, ddp::Half>) return ddp::toHalf(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, ddp::BFloat16>) return ddp::toBFloat16(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <typename T>
double toDouble(T v) {
  if constexpr (std::is_same_v<T, ddp::Half> || std::is_same_v<T, ddp::BFloat16>) return ddp::toFloat(v);
  else return static_cast<double>(v);
}

template <typename T>
std::vector<double> toDoubles(const std::vector<T>& values) {
  std::vector<double> out;
  for (const T& v : values) out.push_back(toDouble(v));
  return out;
}

bool isInteger(DataType type) { return type == DataType::kInt32 || type == DataType::kInt64; }

// The float64 reference of op over ranks of input(rank, i).
double reference(ReduceOp op, DataType type, int size, std::size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = input(r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) acc = isInteger(type) ? std::trunc(acc / size) : acc / size;
  return acc;
}

// Relative tolerance of a result computed in the type (half types round at every ring step).
double tolerance(DataType type) {
  switch (type) {
    case DataType::kFloat16: return 5e-3;
    case DataType::kBFloat16: return 3e-2;
    case DataType::kFloat32: return 1e-6;
    default: return 1e-12;
  }
}

// Empty when every value matches; else the first mismatch.
std::string mismatch(const std::vector<double>& actual, const std::vector<double>& expected, DataType type) {
  if (actual.size() != expected.size()) return "size " + std::to_string(actual.size()) + " != " + std::to_string(expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double allowed = tolerance(type) * std::max(1.0, std::abs(expected[i]));
    if (!(std::abs(actual[i] - expected[i]) <= allowed)) {
      std::ostringstream out;
      out << "element " << i << ": " << actual[i] << " != " << expected[i];
      return out.str();
    }
  }
  return {};
}

using Results = std::map<std::string, std::vector<double>>;

std::string label(const char* what, DataType type, ReduceOp op) {
  return std::string(what) + "/" + ddp::toString(type) + "/" + ddp::toString(op);
}

// Every collective of one element type, as one rank; results by label.
template <typename T>
void runCollectives(ddp::Communicator& comm, Results& out) {
  const int rank = comm.rank();
  const int size = comm.size();
  const DataType type = ddp::dataTypeOf<T>();
  auto inputs = [&](int r, std::size_t n) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = fromDouble<T>(input(r, i));
    return v;
  };
  for (ReduceOp op : kOps) {
    const std::vector<T> send = inputs(rank, kCount);
    std::vector<T> recv(kCount, fromDouble<T>(-99));
    comm.allReduce(send.data(), recv.data(), kCount, type, op);
    out[label("allReduce", type, op)] = toDoubles(recv);

    std::vector<T> inPlace = inputs(rank, kCount);
    comm.allReduce(std::span<T>(inPlace), op);
    out[label("allReduceInPlace", type, op)] = toDoubles(inPlace);

    const std::vector<T> whole = inputs(rank, kBlock * static_cast<std::size_t>(size));
    std::vector<T> block(kBlock, fromDouble<T>(-99));
    comm.reduceScatter(std::span<const T>(whole), std::span<T>(block), op);
    out[label("reduceScatter", type, op)] = toDoubles(block);
  }
  // Broadcast from the last rank, out of place; then from rank 0, in place.
  const int root = size - 1;
  const std::vector<T> mine = inputs(rank, kCount);
  std::vector<T> recv(kCount, fromDouble<T>(-99));
  comm.broadcast(mine.data(), recv.data(), kCount, type, root);
  out[label("broadcast", type, ReduceOp::kSum)] = toDoubles(recv);
  std::vector<T> inPlace = inputs(rank, kCount);
  comm.broadcast(std::span<T>(inPlace), 0);
  out[label("broadcastInPlace", type, ReduceOp::kSum)] = toDoubles(inPlace);

  // All-gather, out of place and in place.
  const std::vector<T> part = inputs(rank, kBlock);
  std::vector<T> gathered(kBlock * static_cast<std::size_t>(size), fromDouble<T>(-99));
  comm.allGather(std::span<const T>(part), std::span<T>(gathered));
  out[label("allGather", type, ReduceOp::kSum)] = toDoubles(gathered);
  std::vector<T> gatheredInPlace(kBlock * static_cast<std::size_t>(size), fromDouble<T>(-99));
  std::copy(part.begin(), part.end(), gatheredInPlace.begin() + static_cast<std::ptrdiff_t>(kBlock * rank));
  comm.allGather(gatheredInPlace.data() + kBlock * rank, gatheredInPlace.data(), kBlock, type);
  out[label("allGatherInPlace", type, ReduceOp::kSum)] = toDoubles(gatheredInPlace);
}

// Checks one type's results of every rank against the references.
void checkCollectives(const std::vector<Results>& results, DataType type) {
  const int size = static_cast<int>(results.size());
  for (int rank = 0; rank < size; ++rank) {
    const Results& got = results[static_cast<std::size_t>(rank)];
    INFO("world size " << size << ", rank " << rank << ", " << ddp::toString(type));
    for (ReduceOp op : kOps) {
      std::vector<double> expected(kCount);
      for (std::size_t i = 0; i < kCount; ++i) expected[i] = reference(op, type, size, i);
      INFO(ddp::toString(op));
      CHECK(mismatch(got.at(label("allReduce", type, op)), expected, type).empty());
      CHECK(mismatch(got.at(label("allReduceInPlace", type, op)), expected, type).empty());
      std::vector<double> block(kBlock);
      for (std::size_t i = 0; i < kBlock; ++i) block[i] = reference(op, type, size, kBlock * rank + i);
      CHECK(mismatch(got.at(label("reduceScatter", type, op)), block, type).empty());
    }
    std::vector<double> fromLast(kCount), fromFirst(kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      fromLast[i] = input(size - 1, i);
      fromFirst[i] = input(0, i);
    }
    CHECK(mismatch(got.at(label("broadcast", type, ReduceOp::kSum)), fromLast, type).empty());
    CHECK(mismatch(got.at(label("broadcastInPlace", type, ReduceOp::kSum)), fromFirst, type).empty());
    std::vector<double> gathered;
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < kBlock; ++i) gathered.push_back(input(r, i));
    }
    CHECK(mismatch(got.at(label("allGather", type, ReduceOp::kSum)), gathered, type).empty());
    CHECK(mismatch(got.at(label("allGatherInPlace", type, ReduceOp::kSum)), gathered, type).empty());
  }
}

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
                           DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16};

}  // namespace

TEST_CASE("gloo: every collective, op and type matches a float64 reference", "[sdk][gloo]") {
  const int size = GENERATE(1, 2, 3, 4);
  std::vector<Results> results(static_cast<std::size_t>(size));
  std::vector<std::vector<float>> large(static_cast<std::size_t>(size));
  constexpr std::size_t kLarge = 300000;  // 1.2 MB: more than one of gloo's 1 MB ring segments
  ddp::test::runGlooRanks(size, [&](ddp::Communicator& comm) {
    Results& out = results[static_cast<std::size_t>(comm.rank())];
    runCollectives<float>(comm, out);
    runCollectives<double>(comm, out);
    runCollectives<int32_t>(comm, out);
    runCollectives<int64_t>(comm, out);
    runCollectives<ddp::Half>(comm, out);
    runCollectives<ddp::BFloat16>(comm, out);
    auto& big = large[static_cast<std::size_t>(comm.rank())];
    big.resize(kLarge);
    for (std::size_t i = 0; i < kLarge; ++i) big[i] = static_cast<float>(input(comm.rank(), i));
    comm.allReduce(std::span<float>(big), ReduceOp::kSum);
  });
  for (DataType type : kTypes) checkCollectives(results, type);
  for (int rank = 0; rank < size; ++rank) {
    std::vector<double> expected(kLarge);
    for (std::size_t i = 0; i < kLarge; ++i) expected[i] = reference(ReduceOp::kSum, DataType::kFloat32, size, i);
    INFO("large all-reduce, world size " << size << ", rank " << rank);
    CHECK(mismatch(toDoubles(large[static_cast<std::size_t>(rank)]), expected, DataType::kFloat32).empty());
  }
}

TEST_CASE("gloo: a barrier holds every rank until all arrived", "[sdk][gloo]") {
  constexpr int kSize = 4;
  constexpr int kRounds = 3;
  std::atomic<int> arrived[kRounds] = {};
  std::vector<std::vector<int>> seen(kSize, std::vector<int>(kRounds));
  ddp::test::runGlooRanks(kSize, [&](ddp::Communicator& comm) {
    for (int round = 0; round < kRounds; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * comm.rank()));
      ++arrived[round];
      comm.barrier();
      seen[static_cast<std::size_t>(comm.rank())][static_cast<std::size_t>(round)] = arrived[round].load();
    }
  });
  for (const auto& ranks : seen) CHECK(ranks == std::vector<int>(kRounds, kSize));
}

TEST_CASE("gloo: asynchronous operations run in issue order and complete on wait", "[sdk][gloo]") {
  constexpr int kSize = 3;
  struct Out {
    std::vector<float> sum, sumAgain;
    std::vector<int64_t> bcast, gathered, scattered;
    bool allCompleted = false;
  };
  std::vector<Out> outs(kSize);
  ddp::test::runGlooRanks(kSize, [&](ddp::Communicator& comm) {
    Out& o = outs[static_cast<std::size_t>(comm.rank())];
    const int64_t r = comm.rank();
    o.sum.assign(1000, static_cast<float>(r + 1));
    o.bcast.assign(4, r * 10);
    std::vector<int64_t> part{r, r + 100};
    o.gathered.assign(2 * kSize, -1);
    std::vector<int64_t> whole(2 * kSize, r + 1);
    o.scattered.assign(2, -1);
    ddp::Work a = comm.allReduceAsync(std::span<float>(o.sum));
    ddp::Work b = comm.broadcastAsync(o.bcast.data(), o.bcast.data(), 4, DataType::kInt64, 1);
    ddp::Work c = comm.allGatherAsync(part.data(), o.gathered.data(), 2, DataType::kInt64);
    ddp::Work d = comm.barrierAsync();
    ddp::Work e = comm.reduceScatterAsync(whole.data(), o.scattered.data(), 2, DataType::kInt64, ReduceOp::kMax);
    // The second sum reads the first one's output: the order is the issue order.
    ddp::Work f = comm.allReduceAsync(std::span<float>(o.sum));
    for (ddp::Work* w : {&f, &e, &d, &c, &b, &a}) w->wait();
    ddp::Work copy = a;
    copy.wait();  // again: returns at once
    o.allCompleted = a.isCompleted() && b.isCompleted() && c.isCompleted() && d.isCompleted() &&
                     e.isCompleted() && f.isCompleted() && ddp::Work().isCompleted();
    o.sumAgain = o.sum;
  });
  for (const Out& o : outs) {
    CHECK(o.allCompleted);
    CHECK(o.sumAgain == std::vector<float>(1000, 3.0f * (1 + 2 + 3)));  // (1+2+3), summed again
    CHECK(o.bcast == std::vector<int64_t>(4, 10));
    CHECK(o.gathered == std::vector<int64_t>{0, 100, 1, 101, 2, 102});
    CHECK(o.scattered == std::vector<int64_t>{3, 3});
  }
}

TEST_CASE("gloo: bad arguments are ConfigErrors, an aborted communicator refuses work", "[sdk][gloo]") {
  ddp::test::runGlooRanks(1, [](ddp::Communicator& comm) {
    std::vector<float> v(4, 1.0f), twice(8);
    CHECK_THROWS_AS(comm.broadcast(std::span<float>(v), 1), ddprun::ConfigError);
    CHECK_THROWS_AS(comm.broadcast(std::span<float>(v), -1), ddprun::ConfigError);
    CHECK_THROWS_AS(comm.allGather(std::span<const float>(v), std::span<float>(twice)), ddprun::ConfigError);
    CHECK_THROWS_AS(comm.reduceScatter(std::span<const float>(twice), std::span<float>(v)), ddprun::ConfigError);
    CHECK_THROWS_AS(comm.allReduce(nullptr, v.data(), 4, DataType::kFloat32, ReduceOp::kSum), ddprun::ConfigError);
    comm.allReduce(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum);  // nothing to do
    CHECK(comm.backend() == ddp::Backend::kGloo);
    comm.allReduce(std::span<float>(v), ReduceOp::kAvg);
    CHECK(v == std::vector<float>(4, 1.0f));
    comm.abort();
    CHECK_THROWS_WITH(comm.allReduce(std::span<float>(v)), Contains("aborted"));
    CHECK_THROWS_AS(comm.barrier(), ddprun::StateError);
  });
  ddp::InProcessStore store;
  CHECK_THROWS_AS(ddp::makeCommunicator(ddp::Backend::kGloo, rankEnv(2, 2), store), ddprun::ConfigError);
  ddp::CommunicatorOptions badAddress = testOptions();
  badAddress.glooHostname = "no-such-host.invalid";
  CHECK_THROWS_WITH(ddp::makeCommunicator(ddp::Backend::kGloo, rankEnv(0, 1), store, badAddress),
                    Contains("cannot resolve") && Contains("no-such-host.invalid"));
}

TEST_CASE("gloo: a collective a peer never joins times out, then the communicator refuses work", "[sdk][gloo]") {
  std::promise<void> rank1Done;
  std::shared_future<void> done = rank1Done.get_future().share();
  std::string firstError, secondError;
  bool timedOut = false, refused = false;
  std::chrono::steady_clock::duration took{};
  ddp::test::runGlooRanks(2, [&](ddp::Communicator& comm) {
    if (comm.rank() == 0) {
      done.wait();  // joins nothing, stays connected
      return;
    }
    std::vector<float> v(16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.allReduce(std::span<float>(v));
    } catch (const ddprun::TimeoutError& e) {
      timedOut = true;
      firstError = e.what();
    }
    took = std::chrono::steady_clock::now() - start;
    try {
      comm.barrier();
    } catch (const ddprun::StateError& e) {
      refused = true;
      secondError = e.what();
    }
    rank1Done.set_value();
  }, testOptions(300ms));
  CHECK(timedOut);
  INFO(firstError);
  CHECK(took >= 250ms);
  CHECK(took < ddprun::test::kSafetyBound);  // the 300 ms timeout, not gloo's default (30 minutes)
  CHECK(refused);
  CHECK_THAT(secondError, Contains("earlier operation failed"));
}

TEST_CASE("gloo: a rank that never comes fails the others' bootstrap with a TimeoutError", "[sdk][gloo]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(ddp::makeCommunicator(ddp::Backend::kGloo, rankEnv(0, 2), store, testOptions(200ms)),
                    Contains("ddp/gloo/default/1"));
  // The communicator's 200 ms timeout, not the store's 30 s.
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);
}

TEST_CASE("gloo: communicators with different names do not meet", "[sdk][gloo]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  std::vector<float> results(2);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ddp::CommunicatorOptions first = testOptions(), second = testOptions();
        first.name = "first";
        second.name = "second";
        auto a = ddp::makeCommunicator(ddp::Backend::kGloo, rankEnv(r, 2), store, first);
        auto b = ddp::makeCommunicator(ddp::Backend::kGloo, rankEnv(r, 2), store, second);
        std::vector<float> v{static_cast<float>(r + 1)};
        b->allReduce(std::span<float>(v));
        a->allReduce(std::span<float>(v));
        results[static_cast<std::size_t>(r)] = v[0];
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  CHECK(results == std::vector<float>{6.0f, 6.0f});
  CHECK(store.check({"ddp/gloo/first/0", "ddp/gloo/second/1"}));
}

TEST_CASE("gloo binds the address that routes to MASTER_ADDR", "[sdk][gloo]") {
  CHECK(ddp::detail::sourceAddressToward("127.0.0.1", 29500) == std::optional<std::string>("127.0.0.1"));
  CHECK_FALSE(ddp::detail::sourceAddressToward("", 29500).has_value());
  CHECK_FALSE(ddp::detail::sourceAddressToward("no-such-host.invalid", 29500).has_value());
  CHECK(ddp::detail::numericAddress("127.0.0.1") == std::optional<std::string>("127.0.0.1"));
  CHECK(ddp::detail::numericAddress("localhost").has_value());
  CHECK_FALSE(ddp::detail::numericAddress("no-such-host.invalid").has_value());
}
