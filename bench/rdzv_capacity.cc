// Rendezvous capacity load generator for bench/rdzv_capacity.py: ONE process simulating many
// agents against a running ddprun-rdzv, each agent with its own connection and its own Session
// stream (gRPC callback API: a few gRPC threads carry every stream, no thread per agent).
//
// What a run does, phase by phase (each phase timed, with the daemon's CPU seconds and RSS read
// from /proc/<daemon_pid>/stat and /status, and this process's own CPU):
//   connect   open one connection per agent (GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL: no sharing), at
//             most --connect_window connecting at once, then open every agent's Session stream
//             and wait for the daemon to go quiet. Real agents connect and join in one go; here
//             connecting is kept apart so that the join phase measures the rendezvous alone.
//   join      every agent sends its Join (--jobs jobs of --nodes nodes, min = max = nodes, so a
//             job's round closes when its last node joins); done when every agent holds its
//             RoundAssigned. Agents heartbeat from their Join on, every heartbeat_timeout/4, and
//             keep the keepalive settings of ddprun's agents (rendezvous/client/grpc_rendezvous.cc).
//   store     (--store) the workers' bootstrap on the first job: one more connection and Store
//             Session stream per agent (a worker), then at once each sets its own key and gets
//             its neighbour's (a get that waits until the key exists).
//   steady    (--steady_seconds S) every agent only heartbeats; the daemon's CPU per second, and
//             whether any agent was told anything (a dropped node interrupts everyone's round).
// --distinct_sources: each agent connects from its own loopback address (127.0.0.2, .3, ...), as
// agents on as many hosts do, instead of all from 127.0.0.1 (one NAT gateway). It implies
// --stream_at_connect: such a channel is made from a connected socket, and gRPC 1.51 reads that
// socket only while a call is in flight, so an idle one never reads the daemon's keepalive PING
// acks and closes itself after the keepalive timeout (seen under a flood, which makes the
// connect phase outlast it: a capture showed every ack sent within 0.2 ms and never read).
// Prints one JSON object. Bounded: --timeout_s ends the run (exit 3) whatever happens; the
// process ends with _exit, leaving the connections to the kernel. --pause_before_join_ms leaves
// time to attach a profiler to the daemon between the connect and join phases.
#include <fmt/core.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "capacity_channels.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "common/token_file.h"
#include "proc_sample.h"
#include "rpc/grpc_runtime.h"
#include "rpc/grpc_util.h"

namespace {

namespace pb = ddprun::v1;
using Clock = std::chrono::steady_clock;
using capacity::ProcSample;
using capacity::sampleProc;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Options {
  std::string address;
  pid_t daemonPid = 0;
  int jobs = 1;
  int nodes = 1000;
  uint32_t heartbeatTimeoutMs = 5000;
  double steadySeconds = 0;
  bool store = false;
  int connectWindow = 256;
  double timeoutS = 300;
  bool keepalive = true;
  std::string tag = "cap";
  uint32_t seed = 1;
  int pauseBeforeJoinMs = 0;  // a profiling aid: time to attach `perf record -p` to the daemon
  std::string token;          // the job token, from --token_file
  bool distinctSources = false;  // each agent from its own loopback address (127.x.y.z)
  std::string tlsCa;             // TLS to a daemon with --tls_cert: the CA to trust (empty: plaintext)
  // Each agent opens its Session stream as soon as its channel exists, as a real agent does (its
  // Join waits for the join phase); else all streams start once every agent is connected.
  bool streamAtConnect = false;
};

// ---- shared counters ----

struct Shared {
  int agents = 0;
  std::string token;  // sent with every call when not empty
  std::atomic<int> assigned{0};
  std::atomic<int> interrupted{0};  // RoundInterrupted, a second RoundAssigned: the round was disturbed
  std::atomic<int> closedOrRejected{0};
  std::atomic<int> streamsEnded{0};
  std::atomic<int> writeFailures{0};
  std::atomic<uint64_t> heartbeatsSent{0};
  std::atomic<uint64_t> heartbeatsSkipped{0};  // the agent's previous writes were still queued
  std::atomic<uint64_t> heartbeatAcks{0};
  std::atomic<int> storeDone{0};
  std::atomic<int> storeFailed{0};
  std::mutex mu;
  std::condition_variable cv;
  std::string firstProblem;  // guarded by mu

  void notify() {
    std::lock_guard<std::mutex> lock(mu);
    cv.notify_all();
  }
  void problem(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (firstProblem.empty()) firstProblem = what;
    cv.notify_all();
  }
};

// A client bidi stream with a write queue: one write in flight, as gRPC requires; writes may come
// from any thread. A hold keeps the reactor alive until the process exits.
template <typename W, typename R>
class QueuedStream : public grpc::ClientBidiReactor<W, R> {
 public:
  explicit QueuedStream(Shared* shared) : shared_(shared) {}

  // False when the stream is dead or `maxQueued` writes already wait.
  bool write(const W& msg, size_t maxQueued = 16) {
    std::unique_lock<std::mutex> lock(writeMu_);
    if (dead_) return false;
    if (writing_) {
      if (pending_.size() >= maxQueued) return false;
      pending_.push_back(msg);
      return true;
    }
    writing_ = true;
    current_ = msg;
    lock.unlock();
    this->StartWrite(&current_);
    return true;
  }

  void OnWriteDone(bool ok) override {
    onWritten(current_, ok);  // current_ is only touched by the one write in flight
    std::unique_lock<std::mutex> lock(writeMu_);
    if (!ok) {
      dead_ = true;
      writing_ = false;
      pending_.clear();
      ++shared_->writeFailures;
      return;
    }
    if (pending_.empty()) {
      writing_ = false;
      return;
    }
    current_ = std::move(pending_.front());
    pending_.pop_front();
    lock.unlock();
    this->StartWrite(&current_);
  }

  void OnDone(const grpc::Status&) override {}

 protected:
  virtual void onWritten(const W&, bool) {}
  Shared* shared_;

 private:
  std::mutex writeMu_;
  std::deque<W> pending_;
  W current_;
  bool writing_ = false;
  bool dead_ = false;
};

// One simulated agent: a Session stream on its own connection.
class Agent final : public QueuedStream<pb::AgentMessage, pb::ServerMessage> {
 public:
  Agent(Shared* shared, int job, std::string runId, std::string nodeId, std::shared_ptr<grpc::Channel> channel,
        std::string host)
      : QueuedStream(shared),
        job(job),
        runId(std::move(runId)),
        nodeId(std::move(nodeId)),
        host(std::move(host)),
        channel(std::move(channel)) {}

  void start() {
    stub_ = pb::Rendezvous::NewStub(channel);
    if (!shared_->token.empty()) context_.AddMetadata(ddprun::kTokenMetadataKey, shared_->token);
    stub_->async()->Session(&context_, this);
    StartRead(&in_);
    AddHold();  // never removed: the process exits with its streams open
    StartCall();
  }

  bool heartbeat() {
    pb::AgentMessage msg;
    msg.mutable_heartbeat()->set_round(round.load());
    // Numbered as ddprun's agent numbers them; the server echoes seq in its HeartbeatAck.
    msg.mutable_heartbeat()->set_seq(++heartbeatSeq_);
    return write(msg, 2);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The stream is over: let it finish, so that OnDone says with which status (who ended it).
      ended_ = true;
      RemoveHold();
      return;
    }
    switch (in_.kind_case()) {
      case pb::ServerMessage::kRoundAssigned:
        if (assignedNs.load() == 0) {
          round = in_.round_assigned().round();
          groupRank = in_.round_assigned().group_rank();
          awaitsStopped_ = in_.round_assigned().awaits_stopped();
          assignedNs = nowNs();
          if (++shared_->assigned == shared_->agents) shared_->notify();
        } else {
          round = in_.round_assigned().round();  // heartbeats name the current round (fencing)
          ++shared_->interrupted;
          shared_->problem("node " + nodeId + ": assigned again: " + in_.ShortDebugString());
        }
        break;
      case pb::ServerMessage::kRoundInterrupted:
        ++shared_->interrupted;
        shared_->problem("node " + nodeId + ": " + in_.ShortDebugString());
        if (awaitsStopped_) {
          // As ddprun's agent: the server holds the next round until this node's workers are gone
          // (it has none), so say so at once rather than leave the job waiting on this node.
          pb::AgentMessage stopped;
          stopped.mutable_workers_stopped()->set_round(in_.round_interrupted().round());
          write(stopped);
        }
        break;
      case pb::ServerMessage::kHeartbeatAck:
        // The server answers every Heartbeat (RoundAssigned.acks_heartbeats); an ack is no news.
        ++shared_->heartbeatAcks;
        break;
      default:
        ++shared_->closedOrRejected;
        shared_->problem("node " + nodeId + ": " + in_.ShortDebugString());
        break;
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    if (!ended_) return;
    ++shared_->streamsEnded;
    shared_->problem("node " + nodeId + ": the server ended its stream (status " +
                     std::to_string(static_cast<int>(status.error_code())) + ": " + status.error_message() + ")" +
                     (joinWrittenNs.load() == 0 ? " before its Join was written" : ""));
  }

  const int job;
  const std::string runId;
  const std::string nodeId;
  const std::string host;  // what its Join names: the address it connects from
  std::shared_ptr<grpc::Channel> channel;
  std::atomic<int64_t> joinIssuedNs{0};
  std::atomic<int64_t> joinWrittenNs{0};
  std::atomic<int64_t> assignedNs{0};
  std::atomic<uint64_t> round{0};
  std::atomic<int> groupRank{-1};

 private:
  bool ended_ = false;
  void onWritten(const pb::AgentMessage& msg, bool ok) override {
    if (ok && msg.has_join()) joinWrittenNs = nowNs();
  }

  std::unique_ptr<pb::Rendezvous::Stub> stub_;
  grpc::ClientContext context_;
  pb::ServerMessage in_;
  uint64_t heartbeatSeq_ = 0;  // only the heartbeat thread writes heartbeats
  bool awaitsStopped_ = false;  // only the read callback touches it
};

// One simulated worker's store stream: set its key, then get its neighbour's (waiting for it).
class StoreWorker final : public QueuedStream<pb::StoreRequest, pb::StoreResponse> {
 public:
  StoreWorker(Shared* shared, int index, int count, std::string runId, uint64_t round, std::shared_ptr<grpc::Channel> channel)
      : QueuedStream(shared), channel(std::move(channel)), index_(index), count_(count), runId_(std::move(runId)),
        round_(round) {}

  void start() {
    stub_ = pb::Store::NewStub(channel);
    if (!shared_->token.empty()) context_.AddMetadata(ddprun::kTokenMetadataKey, shared_->token);
    stub_->async()->Session(&context_, this);
    StartRead(&in_);
    AddHold();
    StartCall();
  }

  static std::string value(int i) { return std::string(64, static_cast<char>('a' + i % 26)); }

  void go() {
    startNs = nowNs();
    pb::StoreRequest req;
    req.set_id(1);
    auto* set = req.mutable_set();
    set->mutable_scope()->set_run_id(runId_);
    set->mutable_scope()->set_round(round_);
    set->set_key("addr/" + std::to_string(index_));
    set->set_value(value(index_));
    if (!write(req)) fail("set not written");
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      fail("store stream ended");
      return;
    }
    if (in_.status().code() != 0) {
      fail("request " + std::to_string(in_.id()) + ": " + in_.status().message());
      return;
    }
    if (in_.id() == 1) {
      setDoneNs = nowNs();
      const int peer = (index_ + 1) % count_;
      pb::StoreRequest req;
      req.set_id(2);
      auto* get = req.mutable_get();
      get->mutable_scope()->set_run_id(runId_);
      get->mutable_scope()->set_round(round_);
      get->set_key("addr/" + std::to_string(peer));
      get->set_timeout_ms(60000);
      StartRead(&in_);
      if (!write(req)) fail("get not written");
      return;
    }
    if (in_.id() == 2) {
      if (in_.get().value() != value((index_ + 1) % count_)) {
        fail("get returned a wrong value");
        return;
      }
      getDoneNs = nowNs();
      if (++shared_->storeDone + shared_->storeFailed.load() == count_) shared_->notify();
    }
  }

  std::shared_ptr<grpc::Channel> channel;
  int64_t startNs = 0;
  std::atomic<int64_t> setDoneNs{0};
  std::atomic<int64_t> getDoneNs{0};

 private:
  void fail(const std::string& what) {
    if (failed_.exchange(true)) return;
    shared_->problem("store worker " + std::to_string(index_) + ": " + what);
    if (++shared_->storeFailed + shared_->storeDone.load() == count_) shared_->notify();
  }

  const int index_;
  const int count_;
  const std::string runId_;
  const uint64_t round_;
  std::atomic<bool> failed_{false};
  std::unique_ptr<pb::Store::Stub> stub_;
  grpc::ClientContext context_;
  pb::StoreResponse in_;
};

// ---- heartbeats: one thread, agents in a FIFO ordered by due time (one interval for all) ----

class Heartbeats {
 public:
  Heartbeats(Shared* shared, std::chrono::milliseconds interval) : shared_(shared), intervalNs_(interval.count() * 1000000) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Heartbeats() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The agent's first heartbeat is one interval after `fromNs` (its Join).
  void add(Agent* agent, int64_t fromNs) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool wake = queue_.empty();
    queue_.push_back({fromNs + intervalNs_, agent});
    if (wake) cv_.notify_all();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (queue_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto [due, agent] = queue_.front();
      if (due > nowNs()) {
        cv_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(due)));
        continue;
      }
      queue_.pop_front();
      queue_.push_back({due + intervalNs_, agent});
      lock.unlock();
      if (agent->heartbeat()) {
        ++shared_->heartbeatsSent;
      } else {
        ++shared_->heartbeatsSkipped;
      }
      lock.lock();
    }
  }

  Shared* shared_;
  const int64_t intervalNs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, Agent*>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// ---- report ----

class Json {
 public:
  Json& num(const std::string& key, double v, int precision = 4) {
    return raw(key, fmt::format("{:.{}f}", v, precision));
  }
  Json& integer(const std::string& key, long long v) { return raw(key, std::to_string(v)); }
  Json& str(const std::string& key, const std::string& v) {
    std::string out = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') out += '\\';
      out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
    return raw(key, out + "\"");
  }
  Json& raw(const std::string& key, const std::string& v) {
    text_ += (text_.empty() ? "" : ",") + ("\"" + key + "\":") + v;
    return *this;
  }
  std::string text() const { return "{" + text_ + "}"; }

 private:
  std::string text_;
};

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// A steady-clock time as milliseconds since the epoch on the system clock.
double epochMs(int64_t steadyNs) {
  const int64_t sys = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  return static_cast<double>(sys - (nowNs() - steadyNs)) / 1e6;
}

double percentile(std::vector<int64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return seconds(v[std::min(i, v.size() - 1)]);
}

struct Phase {
  ProcSample daemon0, self0;
  int64_t t0 = 0;
  void begin(const Options& o) {
    daemon0 = sampleProc(o.daemonPid);
    self0 = sampleProc(0);
    t0 = nowNs();
  }
  // Daemon and generator CPU since begin(), and the daemon's memory now.
  void end(const Options& o, Json& j, const std::string& prefix) const {
    ProcSample d = sampleProc(o.daemonPid);
    ProcSample s = sampleProc(0);
    if (o.daemonPid > 0 && d.ok) {
      j.num(prefix + "_daemon_cpu_s", d.cpuS - daemon0.cpuS, 2);
      j.integer(prefix + "_daemon_rss_kb", d.rssKb);
      j.integer(prefix + "_daemon_hwm_kb", d.hwmKb);
    }
    j.num(prefix + "_gen_cpu_s", s.cpuS - self0.cpuS, 2);
    j.num(prefix + "_wall_s", seconds(nowNs() - t0), 4);
  }
};

// Waits until the daemon has used under one clock tick of CPU in 300 ms (it has caught up), at
// most `limit`; without a daemon pid, sleeps 300 ms.
void quiesce(const Options& o, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  if (o.daemonPid <= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return;
  }
  double last = sampleProc(o.daemonPid).cpuS;
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    double now = sampleProc(o.daemonPid).cpuS;
    if (now - last < 0.015) return;
    last = now;
  }
}

[[noreturn]] void usage(const char* argv0) {
  std::cerr << "usage: " << argv0
            << " --address HOST:PORT [--daemon_pid PID] [--jobs J] [--nodes N] [--heartbeat_timeout_ms MS]\n"
               "       [--steady_seconds S] [--store] [--connect_window W] [--timeout_s S] [--no_keepalive] [--tag T] [--seed N]\n"
               "       [--distinct_sources] [--tls_ca CA.pem] [--stream_at_connect]\n"
               "       [--pause_before_join_ms MS] [--token_file PATH]\n";
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
    if (a == "--address") o.address = next();
    else if (a == "--daemon_pid") o.daemonPid = static_cast<pid_t>(std::atoi(next().c_str()));
    else if (a == "--jobs") o.jobs = std::atoi(next().c_str());
    else if (a == "--nodes") o.nodes = std::atoi(next().c_str());
    else if (a == "--heartbeat_timeout_ms") o.heartbeatTimeoutMs = static_cast<uint32_t>(std::atol(next().c_str()));
    else if (a == "--steady_seconds") o.steadySeconds = std::atof(next().c_str());
    else if (a == "--store") o.store = true;
    else if (a == "--connect_window") o.connectWindow = std::atoi(next().c_str());
    else if (a == "--timeout_s") o.timeoutS = std::atof(next().c_str());
    else if (a == "--no_keepalive") o.keepalive = false;
    else if (a == "--tag") o.tag = next();
    else if (a == "--seed") o.seed = static_cast<uint32_t>(std::atol(next().c_str()));
    else if (a == "--pause_before_join_ms") o.pauseBeforeJoinMs = std::atoi(next().c_str());
    else if (a == "--token_file") o.token = ddprun::readTokenFile(next(), "--token_file");
    else if (a == "--distinct_sources") o.distinctSources = o.streamAtConnect = true;
    else if (a == "--tls_ca") o.tlsCa = next();
    else if (a == "--stream_at_connect") o.streamAtConnect = true;
    else usage(argv[0]);
  }
  const long total = static_cast<long>(o.jobs) * o.nodes;
  if (o.address.empty() || o.jobs < 1 || o.nodes < 1 || total > 20000 || o.heartbeatTimeoutMs < 100 ||
      o.heartbeatTimeoutMs > 600000 || o.steadySeconds < 0 || o.steadySeconds > 600 || o.connectWindow < 1 ||
      o.timeoutS <= 0 || o.timeoutS > 3600 || o.pauseBeforeJoinMs < 0 ||
      o.pauseBeforeJoinMs > 60000 || (o.distinctSources && !o.tlsCa.empty())) {
    usage(argv[0]);
  }
  return o;
}

// What has been measured so far; printed at the end, or by the watchdog with the error.
std::mutex reportMu;
Json report;
std::string currentPhase = "setup";

[[noreturn]] void finish(int code, const std::string& error) {
  std::lock_guard<std::mutex> lock(reportMu);
  Json out = report;
  out.str("error", error);
  std::cout << out.text() << std::endl;
  std::fflush(nullptr);
  ::_exit(code);
}

void setPhase(const std::string& name) {
  std::lock_guard<std::mutex> lock(reportMu);
  currentPhase = name;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  ddprun::prepareGrpcRuntime();
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  const int total = o.jobs * o.nodes;
  const int storeClients = o.store ? o.nodes : 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.timeoutS * 1000));
  {
    std::lock_guard<std::mutex> lock(reportMu);
    report.integer("jobs", o.jobs).integer("nodes", o.nodes).integer("agents", total);
    report.integer("heartbeat_timeout_ms", o.heartbeatTimeoutMs).integer("store_clients", storeClients);
    report.integer("nofile", static_cast<long long>(limit.rlim_cur));
  }
  if (static_cast<rlim_t>(total + storeClients + 256) > limit.rlim_cur) {
    finish(2, "open file limit " + std::to_string(limit.rlim_cur) + " is too small for " +
                  std::to_string(total + storeClients) + " connections");
  }
  std::thread([deadline] {
    std::this_thread::sleep_until(deadline);
    std::string phase;
    {
      std::lock_guard<std::mutex> lock(reportMu);
      phase = currentPhase;
    }
    finish(3, "timed out in phase " + phase);
  }).detach();

  Shared shared;
  shared.token = o.token;
  shared.agents = total;
  // ---- connect ----
  setPhase("connect");
  Phase connect;
  connect.begin(o);
  std::vector<std::unique_ptr<Agent>> agents;
  agents.reserve(static_cast<size_t>(total));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  const capacity::AgentChannelSettings channelSettings{o.address, o.heartbeatTimeoutMs, o.keepalive, o.distinctSources,
                                                       o.tlsCa};
  for (int j = 0; j < o.jobs; ++j) {
    const std::string runId = o.tag + "-" + std::to_string(j);
    for (int n = 0; n < o.nodes; ++n) {
      channels.push_back(capacity::agentChannel(channelSettings, static_cast<long>(channels.size())));
      if (!channels.back()) {
        finish(1, "agent " + std::to_string(channels.size()) + " could not connect from its own loopback address (--distinct_sources)");
      }
      agents.push_back(std::make_unique<Agent>(&shared, j, runId, "node-" + std::to_string(n), channels.back(),
                                               o.distinctSources ? capacity::sourceAddressOf(static_cast<long>(channels.size()) - 1)
                                                                 : std::string("127.0.0.1")));
      // As a real agent: its Session stream (the request headers with the token) at once; its
      // Join still waits for the join phase.
      if (o.streamAtConnect) agents.back()->start();
    }
  }
  // A channel made from a connected socket has no connectivity state to watch (gRPC aborts).
  const int ready = o.distinctSources ? total : capacity::connectAll(channels, o.connectWindow, deadline);
  if (ready != total) finish(1, std::to_string(total - ready) + " of " + std::to_string(total) + " agents could not connect");
  quiesce(o, std::chrono::seconds(20));
  if (o.daemonPid > 0) {
    std::lock_guard<std::mutex> lock(reportMu);
    report.integer("connect_daemon_rss_before_streams_kb", sampleProc(o.daemonPid).rssKb);
  }
  if (!o.streamAtConnect) {
    for (auto& a : agents) a->start();
  }
  quiesce(o, std::chrono::seconds(20));
  {
    std::lock_guard<std::mutex> lock(reportMu);
    connect.end(o, report, "connect");
  }
  if (shared.streamsEnded.load() > 0) finish(1, "streams ended before Join: " + shared.firstProblem);
  if (o.pauseBeforeJoinMs > 0) {
    std::cerr << "connected; joining in " << o.pauseBeforeJoinMs << " ms" << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(o.pauseBeforeJoinMs));
  }

  // ---- join ----
  setPhase("join");
  // Interleaved across jobs (a shuffled order): many jobs starting at the same time.
  std::vector<Agent*> order;
  for (auto& a : agents) order.push_back(a.get());
  if (o.jobs > 1) std::shuffle(order.begin(), order.end(), std::mt19937(o.seed));
  pb::JobRules rules;
  rules.set_min_nodes(o.nodes);
  rules.set_max_nodes(o.nodes);
  rules.set_max_restarts(0);
  rules.set_join_timeout_ms(600000);
  rules.set_last_call_timeout_ms(30000);
  rules.set_heartbeat_timeout_ms(o.heartbeatTimeoutMs);
  Heartbeats heartbeats(&shared, std::chrono::milliseconds(o.heartbeatTimeoutMs / 4));
  Phase join;
  join.begin(o);
  const int64_t firstJoinNs = nowNs();
  int port = 30000;
  for (Agent* a : order) {
    pb::AgentMessage msg;
    auto* j = msg.mutable_join();
    j->set_run_id(a->runId);
    j->set_node_id(a->nodeId);
    j->set_local_world_size(8);
    *j->mutable_rules() = rules;
    j->set_host(a->host);
    j->set_master_port(port++ % 30000 + 30000);
    j->set_node_rank(-1);
    j->set_reports_stopped(true);  // as ddprun's agents: it answers RoundInterrupted with WorkersStopped
    const int64_t t = nowNs();
    a->joinIssuedNs = t;
    if (!a->write(msg)) finish(1, "a Join could not be written");
    heartbeats.add(a, t);
  }
  const int64_t lastJoinIssuedNs = nowNs();
  {
    std::unique_lock<std::mutex> lock(shared.mu);
    shared.cv.wait_until(lock, deadline, [&] {
      return shared.assigned.load() == total || shared.streamsEnded.load() > 0 || shared.closedOrRejected.load() > 0;
    });
  }
  if (shared.assigned.load() != total) {
    finish(1, std::to_string(shared.assigned.load()) + " of " + std::to_string(total) + " agents assigned: " + shared.firstProblem);
  }
  int64_t lastWrittenNs = 0, lastAssignedNs = 0;
  std::vector<int64_t> jobLastWritten(static_cast<size_t>(o.jobs), 0), jobLastAssigned(static_cast<size_t>(o.jobs), 0);
  for (auto& a : agents) {
    lastWrittenNs = std::max(lastWrittenNs, a->joinWrittenNs.load());
    lastAssignedNs = std::max(lastAssignedNs, a->assignedNs.load());
    auto& w = jobLastWritten[static_cast<size_t>(a->job)];
    auto& s = jobLastAssigned[static_cast<size_t>(a->job)];
    w = std::max(w, a->joinWrittenNs.load());
    s = std::max(s, a->assignedNs.load());
  }
  std::vector<int64_t> jobClose;  // per job: its last Join written -> its last node assigned
  for (int j = 0; j < o.jobs; ++j) jobClose.push_back(jobLastAssigned[static_cast<size_t>(j)] - jobLastWritten[static_cast<size_t>(j)]);
  {
    std::lock_guard<std::mutex> lock(reportMu);
    join.end(o, report, "join");
    report.num("join_issue_s", seconds(lastJoinIssuedNs - firstJoinNs));
    report.num("first_join_to_all_assigned_s", seconds(lastAssignedNs - firstJoinNs));
    report.num("last_join_sent_to_all_assigned_s", seconds(lastAssignedNs - lastWrittenNs));
    report.num("job_close_p50_s", percentile(jobClose, 0.5));
    report.num("job_close_p99_s", percentile(jobClose, 0.99));
    report.num("job_close_max_s", percentile(jobClose, 1.0));
    // Wall-clock anchors (ms since the epoch) to line up with the daemon's log timestamps.
    report.num("first_join_epoch_ms", epochMs(firstJoinNs), 1);
    report.num("last_join_written_epoch_ms", epochMs(lastWrittenNs), 1);
    report.num("all_assigned_epoch_ms", epochMs(lastAssignedNs), 1);
  }

  // ---- store: the workers' bootstrap on job 0 ----
  if (o.store) {
    setPhase("store-connect");
    const std::string runId = agents[0]->runId;
    const uint64_t round = agents[0]->round.load();
    Phase storeConnect;
    storeConnect.begin(o);
    std::vector<std::unique_ptr<StoreWorker>> workers;
    std::vector<std::shared_ptr<grpc::Channel>> storeChannels;
    for (int i = 0; i < storeClients; ++i) {
      storeChannels.push_back(capacity::storeChannel(o.address, o.tlsCa));
      workers.push_back(std::make_unique<StoreWorker>(&shared, i, storeClients, runId, round, storeChannels.back()));
    }
    if (capacity::connectAll(storeChannels, o.connectWindow, deadline) != storeClients) finish(1, "store clients could not connect");
    for (auto& w : workers) w->start();
    quiesce(o, std::chrono::seconds(20));
    {
      std::lock_guard<std::mutex> lock(reportMu);
      storeConnect.end(o, report, "store_connect");
    }
    setPhase("store");
    Phase store;
    store.begin(o);
    const int64_t goNs = nowNs();
    for (auto& w : workers) w->go();
    {
      std::unique_lock<std::mutex> lock(shared.mu);
      shared.cv.wait_until(lock, deadline, [&] { return shared.storeDone.load() + shared.storeFailed.load() == storeClients; });
    }
    if (shared.storeDone.load() != storeClients) {
      finish(1, std::to_string(shared.storeFailed.load()) + " store workers failed: " + shared.firstProblem);
    }
    std::vector<int64_t> setLat, getLat;
    int64_t lastDoneNs = 0;
    for (auto& w : workers) {
      setLat.push_back(w->setDoneNs.load() - w->startNs);
      getLat.push_back(w->getDoneNs.load() - w->setDoneNs.load());
      lastDoneNs = std::max(lastDoneNs, w->getDoneNs.load());
    }
    {
      std::lock_guard<std::mutex> lock(reportMu);
      store.end(o, report, "store");
      report.num("store_all_done_s", seconds(lastDoneNs - goNs));
      report.num("store_set_p50_s", percentile(setLat, 0.5)).num("store_set_p99_s", percentile(setLat, 0.99));
      report.num("store_get_p50_s", percentile(getLat, 0.5)).num("store_get_p99_s", percentile(getLat, 0.99));
    }
    // The workers keep their streams open (idle), as real workers do while they train.
  }

  // ---- steady state: heartbeats only ----
  if (o.steadySeconds > 0) {
    setPhase("steady");
    // Every agent has sent at least one heartbeat before the window opens.
    std::this_thread::sleep_for(std::chrono::milliseconds(o.heartbeatTimeoutMs / 4 + 100));
    const int disturbedBefore = shared.interrupted.load() + shared.closedOrRejected.load() + shared.streamsEnded.load();
    Phase steady;
    steady.begin(o);
    const uint64_t hb0 = shared.heartbeatsSent.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.steadySeconds * 1000)));
    const uint64_t hb1 = shared.heartbeatsSent.load();
    ProcSample d1 = sampleProc(o.daemonPid);
    ProcSample s1 = sampleProc(0);
    const double wall = seconds(nowNs() - steady.t0);
    std::lock_guard<std::mutex> lock(reportMu);
    steady.end(o, report, "steady");
    if (o.daemonPid > 0) {
      report.num("steady_daemon_cpu_per_s", (d1.cpuS - steady.daemon0.cpuS) / wall, 4);
      report.num("steady_daemon_us_per_heartbeat", (d1.cpuS - steady.daemon0.cpuS) * 1e6 / static_cast<double>(std::max<uint64_t>(hb1 - hb0, 1)), 1);
    }
    report.num("steady_gen_cpu_per_s", (s1.cpuS - steady.self0.cpuS) / wall, 4);
    report.num("steady_heartbeats_per_s", static_cast<double>(hb1 - hb0) / wall, 1);
    report.integer("steady_disturbed", shared.interrupted.load() + shared.closedOrRejected.load() +
                                           shared.streamsEnded.load() - disturbedBefore);
  }

  {
    std::lock_guard<std::mutex> lock(reportMu);
    ProcSample d = sampleProc(o.daemonPid);
    ProcSample s = sampleProc(0);
    if (o.daemonPid > 0 && d.ok) {
      report.integer("daemon_rss_kb", d.rssKb).integer("daemon_hwm_kb", d.hwmKb).integer("daemon_threads", d.threads);
      report.num("daemon_cpu_total_s", d.cpuS, 2);
    }
    report.integer("gen_hwm_kb", s.hwmKb).num("gen_cpu_total_s", s.cpuS, 2).integer("gen_threads", s.threads);
    report.integer("heartbeats_sent", static_cast<long long>(shared.heartbeatsSent.load()));
    report.integer("heartbeats_skipped", static_cast<long long>(shared.heartbeatsSkipped.load()));
    report.integer("heartbeat_acks", static_cast<long long>(shared.heartbeatAcks.load()));
    report.integer("interrupted", shared.interrupted.load()).integer("closed_or_rejected", shared.closedOrRejected.load());
    report.integer("streams_ended", shared.streamsEnded.load()).integer("write_failures", shared.writeFailures.load());
  }
  std::string problem;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    problem = shared.firstProblem;
  }
  finish(problem.empty() ? 0 : 1, problem);
}
