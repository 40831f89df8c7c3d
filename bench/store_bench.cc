// Store load generator for bench/multinode_bench.py: operations per second of set, get, add and
// compare_set with C concurrent clients, each client its own connection (a forked process by
// default, as every worker of a job has its own; --threads runs them as threads of one process).
//
// One source, two binaries (bench/CMakeLists.txt), so that the two stacks never share a process:
//   ddprun-store-bench  StoreClient (gRPC) against ddprun-rdzv; needs the run id and a current round
//   tcpstore-bench      c10d::TCPStore from libtorch 1.13; `--serve PORT` hosts a TCPStore server
//
// Every client runs the same loop on its own keys for --seconds after a common start barrier and
// records each call's latency in a log-scale histogram. Prints one JSON object per measurement:
//   {"backend":..., "op":..., "clients":C, "mode":"procs", "ops":N, "seconds":S, "ops_per_s":R,
//    "p50_us":..., "p99_us":..., "errors":E, "error":"..."}
//
// --ops bootstrap is not a loop but what a job's C ranks do with the store once at start, the way
// gloo's full-mesh connect and c10d's barrier use it: from the common start, each rank connects,
// publishes its address, reads every peer's (a get that waits for the key), then meets the others
// at a barrier (add; the last to arrive sets "done"; everyone gets it). "seconds" is then the
// wall time from the start to the last rank through the barrier.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(STORE_BENCH_DDPRUN)
#include "store/client/store_client.h"
#elif defined(STORE_BENCH_TCPSTORE)
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#else
#error "define STORE_BENCH_DDPRUN or STORE_BENCH_TCPSTORE"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string runId;    // ddprun only
  uint64_t round = 0;   // ddprun only
  std::vector<std::string> ops = {"set", "get", "add", "compare_set"};
  std::vector<int> clients = {1, 8, 64};
  double seconds = 2.0;
  int valueBytes = 32;
  bool threads = false;
  std::string tag = "b";
  int servePort = 0;    // tcpstore only: host a server
  std::string tlsCa, tlsCert, tlsKey;  // ddprun only: TLS to the store (--tls_ca turns it on)
};

// ---- the two clients, behind one interface ----

class Client {
 public:
  virtual ~Client() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual std::string compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) = 0;
};

#if defined(STORE_BENCH_DDPRUN)
constexpr const char* kBackend = "ddprun";

class BenchClient final : public Client {
 public:
  explicit BenchClient(const Options& o)
      : client_(ddprun::StoreClientOptions{o.host + ":" + std::to_string(o.port), "", o.runId, o.round,
                                           std::chrono::milliseconds(30000), std::chrono::milliseconds(10000),
                                           std::chrono::milliseconds(30000),
                                           ddprun::TlsClientOptions{!o.tlsCa.empty(), o.tlsCa, o.tlsCert, o.tlsKey}}) {}
  void set(const std::string& k, const std::string& v) override { client_.set(k, v); }
  std::string get(const std::string& k) override { return client_.get(k); }
  int64_t add(const std::string& k, int64_t d) override { return client_.add(k, d); }
  std::string compareSet(const std::string& k, const std::string& e, const std::string& d) override {
    return client_.compareSet(k, e, d);
  }

 private:
  ddprun::StoreClient client_;
};
#else
constexpr const char* kBackend = "tcpstore";

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string str(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

c10d::TCPStoreOptions tcpOptions(int port, bool server) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = server;
  o.numWorkers = c10::nullopt;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(30000);
  return o;
}

class BenchClient final : public Client {
 public:
  explicit BenchClient(const Options& o) : store_(o.host, tcpOptions(o.port, false)) {}
  void set(const std::string& k, const std::string& v) override { store_.set(k, bytes(v)); }
  std::string get(const std::string& k) override { return str(store_.get(k)); }
  int64_t add(const std::string& k, int64_t d) override { return store_.add(k, d); }
  std::string compareSet(const std::string& k, const std::string& e, const std::string& d) override {
    return str(store_.compareSet(k, bytes(e), bytes(d)));
  }

 private:
  c10d::TCPStore store_;
};
#endif

// ---- per-client results, in memory that forked children share with the parent ----

constexpr int kBuckets = 400;  // bucket b holds latencies in [2^(b/8), 2^((b+1)/8)) ns

struct Slot {
  uint64_t ops;
  uint64_t elapsedNs;
  uint64_t endNs;  // bootstrap: steady clock when this rank left the barrier (0: it did not)
  uint64_t errors;
  uint32_t hist[kBuckets];
  char error[256];
};

int bucketOf(uint64_t ns) {
  if (ns < 1) ns = 1;
  int b = static_cast<int>(std::log2(static_cast<double>(ns)) * 8.0);
  return b < 0 ? 0 : (b >= kBuckets ? kBuckets - 1 : b);
}

double percentileUs(const std::vector<uint64_t>& hist, double q) {
  uint64_t total = 0;
  for (auto h : hist) total += h;
  if (total == 0) return 0;
  const auto want = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += hist[b];
    if (seen >= want) return std::pow(2.0, (b + 0.5) / 8.0) / 1000.0;
  }
  return 0;
}

void recordError(Slot* slot, const char* what) {
  ++slot->errors;
  if (slot->error[0] == '\0') std::snprintf(slot->error, sizeof slot->error, "%s", what);
}

// One client's whole life: connect, prepare its keys, meet the others at the barrier, run.
// `ready` and `go` are the barrier, whatever carries it (pipes between processes, a latch between
// threads).
template <typename Ready, typename Go>
void runClient(const Options& o, const std::string& op, int id, Slot* slot, Ready ready, Go go) {
  std::unique_ptr<Client> client;
  const std::string key = o.tag + "/" + op + "/" + std::to_string(id);
  const std::string valueA(static_cast<std::size_t>(o.valueBytes), 'a');
  const std::string valueB(static_cast<std::size_t>(o.valueBytes), 'b');
  try {
    client = std::make_unique<BenchClient>(o);
    if (op == "get" || op == "compare_set") client->set(key, valueA);
  } catch (const std::exception& e) {
    recordError(slot, e.what());
  }
  ready();
  go();
  if (!client) return;
  const std::chrono::duration<double> window(o.seconds);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(window);
  uint64_t n = 0;
  auto t0 = start;
  try {
    while (t0 < end) {
      if (op == "set") {
        client->set(key, (n & 1) ? valueA : valueB);
      } else if (op == "get") {
        if (client->get(key).size() != valueA.size()) recordError(slot, "get returned a wrong value");
      } else if (op == "add") {
        client->add(key, 1);
      } else {
        // Alternates a->b, b->a: every call swaps, as a lock or a leader election would.
        const bool even = (n & 1) == 0;
        const std::string& desired = even ? valueB : valueA;
        if (client->compareSet(key, even ? valueA : valueB, desired) != desired) {
          recordError(slot, "compare_set did not swap");
        }
      }
      const auto t1 = Clock::now();
      ++slot->hist[bucketOf(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()))];
      ++n;
      t0 = t1;
    }
  } catch (const std::exception& e) {
    recordError(slot, e.what());
  }
  slot->ops = n;
  slot->elapsedNs = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - start).count());
}

uint64_t steadyNs(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

// One rank of a job's store bootstrap (see the top of the file). Connecting is part of it: every
// rank of a starting job connects at the same moment.
template <typename Ready, typename Go>
void runBootstrapRank(const Options& o, int id, int count, Slot* slot, Ready ready, Go go) {
  const std::string prefix = o.tag + "/bootstrap/";
  const std::string address(64, static_cast<char>('a' + id % 26));
  ready();
  go();
  uint64_t n = 0;
  auto t0 = Clock::now();
  auto timed = [&] {
    const auto t1 = Clock::now();
    ++slot->hist[bucketOf(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()))];
    ++n;
    t0 = t1;
  };
  try {
    BenchClient client(o);
    t0 = Clock::now();
    client.set(prefix + "addr/" + std::to_string(id), address);
    timed();
    for (int k = 1; k < count; ++k) {
      const int peer = (id + k) % count;
      if (client.get(prefix + "addr/" + std::to_string(peer)).size() != address.size()) {
        recordError(slot, "get returned a wrong address");
      }
      timed();
    }
    const bool last = client.add(prefix + "arrived", 1) == count;
    timed();
    if (last) {
      client.set(prefix + "done", "1");
      timed();
    }
    client.get(prefix + "done");
    timed();
    slot->endNs = steadyNs(t0);
  } catch (const std::exception& e) {
    recordError(slot, e.what());
  }
  slot->ops = n;
}

template <typename Ready, typename Go>
void runRank(const Options& o, const std::string& op, int id, int count, Slot* slot, Ready ready, Go go) {
  if (op == "bootstrap") {
    runBootstrapRank(o, id, count, slot, ready, go);
  } else {
    runClient(o, op, id, slot, ready, go);
  }
}

bool readFull(int fd, int count) {
  char buf[256];
  int got = 0;
  while (got < count) {
    ssize_t r = ::read(fd, buf, std::min<std::size_t>(sizeof buf, static_cast<std::size_t>(count - got)));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    got += static_cast<int>(r);
  }
  return true;
}

// Clients as forked processes. The parent never creates a client, so no gRPC or TCPStore state
// exists at fork time.
bool runProcesses(const Options& o, const std::string& op, int count, Slot* slots, uint64_t* goNs) {
  int readyPipe[2], goPipe[2];
  if (::pipe(readyPipe) != 0 || ::pipe(goPipe) != 0) return false;
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) {
      ::close(readyPipe[0]);
      ::close(goPipe[1]);
      ::alarm(static_cast<unsigned>(o.seconds + 120));  // never outlive a stuck run
      runRank(
          o, op, i, count, &slots[i],
          [&] {
            char c = 'r';
            (void)!::write(readyPipe[1], &c, 1);
          },
          [&] {
            char c;
            (void)!::read(goPipe[0], &c, 1);  // EOF when the parent closes its end
          });
      std::fflush(nullptr);
      ::_exit(0);  // skip the client libraries' static destructors
    }
    pids.push_back(pid);
  }
  ::close(readyPipe[1]);
  ::close(goPipe[0]);
  bool ok = static_cast<int>(pids.size()) == count && readFull(readyPipe[0], count);
  *goNs = steadyNs(Clock::now());
  ::close(goPipe[1]);  // go
  ::close(readyPipe[0]);
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
  }
  return ok;
}

bool runThreads(const Options& o, const std::string& op, int count, Slot* slots, uint64_t* goNs) {
  std::mutex m;
  std::condition_variable cv;
  int readyCount = 0;
  bool started = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      runRank(
          o, op, i, count, &slots[i],
          [&] {
            std::lock_guard lock(m);
            if (++readyCount == count) cv.notify_all();
          },
          [&] {
            std::unique_lock lock(m);
            cv.wait(lock, [&] { return started; });
          });
    });
  }
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return readyCount == count; });
    *goNs = steadyNs(Clock::now());
    started = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  return true;
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    out += c;
  }
  return out;
}

void measure(const Options& o, const std::string& op, int count) {
  const std::size_t size = sizeof(Slot) * static_cast<std::size_t>(count);
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  std::memset(mem, 0, size);
  auto* slots = static_cast<Slot*>(mem);
  uint64_t goNs = 0;
  bool ok = o.threads ? runThreads(o, op, count, slots, &goNs) : runProcesses(o, op, count, slots, &goNs);

  uint64_t ops = 0, errors = 0;
  double maxElapsed = 0;
  uint64_t lastEndNs = 0;
  bool sawCause = false;
  bool everyRankEnded = true;
  std::string error;
  std::vector<uint64_t> hist(kBuckets, 0);
  for (int i = 0; i < count; ++i) {
    ops += slots[i].ops;
    errors += slots[i].errors;
    maxElapsed = std::max(maxElapsed, static_cast<double>(slots[i].elapsedNs) / 1e9);
    lastEndNs = std::max(lastEndNs, slots[i].endNs);
    everyRankEnded = everyRankEnded && slots[i].endNs != 0;
    for (int b = 0; b < kBuckets; ++b) hist[b] += slots[i].hist[b];
    // The first error, and the first that is not a timeout: one rank's failure makes the others
    // time out waiting for its key, and the cause is that rank's error.
    if (slots[i].error[0]) {
      const std::string mine = "rank " + std::to_string(i) + ": " + slots[i].error;
      const bool timeout = std::strstr(slots[i].error, "timed out") != nullptr;
      if (error.empty()) {
        error = mine;
        sawCause = !timeout;
      } else if (!sawCause && !timeout) {
        error += " | " + mine;
        sawCause = true;
      }
    }
  }
  if (!ok && error.empty()) error = "a client process failed";
  ::munmap(mem, size);
  // Loops: every client ran for the same window; the slowest one's window is the divisor.
  // Bootstrap: from the common start to the last rank through the barrier.
  double seconds = maxElapsed > 0 ? maxElapsed : o.seconds;
  if (op == "bootstrap") {
    if (!everyRankEnded && error.empty()) error = "a rank did not finish the bootstrap";
    seconds = everyRankEnded && lastEndNs > goNs ? static_cast<double>(lastEndNs - goNs) / 1e9 : 0.0;
  }
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(1);
  line << "{\"backend\":\"" << kBackend << "\",\"op\":\"" << op << "\",\"clients\":" << count
       << ",\"mode\":\"" << (o.threads ? "threads" : "procs") << "\",\"ops\":" << ops;
  line.precision(4);
  line << ",\"seconds\":" << seconds;
  line.precision(1);
  line << ",\"ops_per_s\":" << (seconds > 0 ? static_cast<double>(ops) / seconds : 0.0);
  line.precision(2);
  line << ",\"p50_us\":" << percentileUs(hist, 0.5) << ",\"p99_us\":" << percentileUs(hist, 0.99)
       << ",\"errors\":" << errors << ",\"error\":\"" << jsonEscape(error) << "\"}";
  std::cout << line.str() << std::endl;
}

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void usage(const char* argv0) {
  std::cerr << "usage: " << argv0
            << " --port P [--host H] [--ops set,get,add,compare_set,bootstrap] [--clients 1,8,64] [--seconds S]\n"
               "       [--value_bytes B] [--threads] [--tag T]"
#if defined(STORE_BENCH_DDPRUN)
               " --run_id ID --round N\n";
#else
               "\n       "
            << argv0 << " --serve PORT   (host a TCPStore server on 127.0.0.1 until SIGTERM)\n";
#endif
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (a == "--host") o.host = next();
    else if (a == "--port") o.port = std::atoi(next().c_str());
    else if (a == "--run_id") o.runId = next();
    else if (a == "--round") o.round = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--ops") o.ops = splitList(next());
    else if (a == "--clients") {
      o.clients.clear();
      for (const auto& c : splitList(next())) o.clients.push_back(std::atoi(c.c_str()));
    } else if (a == "--seconds") o.seconds = std::atof(next().c_str());
    else if (a == "--value_bytes") o.valueBytes = std::atoi(next().c_str());
    else if (a == "--threads") o.threads = true;
    else if (a == "--tag") o.tag = next();
    else if (a == "--serve") o.servePort = std::atoi(next().c_str());
    else if (a == "--tls_ca") o.tlsCa = next();
    else if (a == "--tls_cert") o.tlsCert = next();
    else if (a == "--tls_key") o.tlsKey = next();
    else usage(argv[0]);
  }
  for (const auto& op : o.ops) {
    if (op != "set" && op != "get" && op != "add" && op != "compare_set" && op != "bootstrap") usage(argv[0]);
  }
  for (int c : o.clients) {
    if (c < 1 || c > 4096) usage(argv[0]);
  }
  if (o.valueBytes < 1) usage(argv[0]);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
#if defined(STORE_BENCH_TCPSTORE)
  if (o.servePort > 0) {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before TCPStore starts its threads
    c10d::TCPStore server("127.0.0.1", tcpOptions(o.servePort, true));
    std::cout << "tcpstore listening on 127.0.0.1:" << server.getPort() << std::endl;
    int sig = 0;
    sigwait(&stop, &sig);
    std::fflush(nullptr);
    ::_exit(0);
  }
#endif
  if (o.port <= 0) usage(argv[0]);
#if defined(STORE_BENCH_DDPRUN)
  if (o.runId.empty()) usage(argv[0]);
#endif
  for (int c : o.clients) {
    for (const auto& op : o.ops) measure(o, op, c);
  }
  return 0;
}
