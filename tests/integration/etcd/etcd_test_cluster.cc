#include "etcd_test_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include "common/strings.h"
#include "etcd/etcd_client.h"

namespace ddprun::test {

namespace {
constexpr const char* kScript = DDPRUN_SOURCE_DIR "/scripts/etcd_cluster.py";
constexpr auto kElectionBound = std::chrono::seconds(30);  // safety bound, elections take < 1 s here
}  // namespace

std::string EtcdTestCluster::unavailableReason() {
  if (access("/usr/bin/etcd", X_OK) != 0) return "needs etcd (/usr/bin/etcd; apt-get install etcd-server)";
  return "";
}

EtcdTestCluster::EtcdTestCluster() {
  // exec: the fixture is our child (its PDEATHSIG follows this thread), not a shell's.
  std::string cmd = std::string("exec /usr/bin/python3 ") + kScript + " serve --ttl 240";
  pipe_ = popen(cmd.c_str(), "r");
  if (!pipe_) throw std::runtime_error("cannot start " + cmd);
  char line[4096];
  if (!fgets(line, sizeof line, pipe_)) {
    pclose(pipe_);
    throw std::runtime_error("etcd_cluster.py ended without READY");
  }
  std::string text(trim(line));
  if (!startsWith(text, "READY ")) {
    pclose(pipe_);
    throw std::runtime_error("etcd_cluster.py: " + text);
  }
  for (const auto& field : split(text.substr(6), ' ')) {
    auto eq = field.find('=');
    std::string k = field.substr(0, eq), v = field.substr(eq + 1);
    if (k == "pid") fixturePid_ = std::stoi(v);
    if (k == "endpoints") endpoints_ = split(v, ',');
    if (k == "pids") {
      for (const auto& p : split(v, ',')) pids_.push_back(std::stoi(p));
    }
  }
  down_.assign(pids_.size(), false);
}

EtcdTestCluster::~EtcdTestCluster() {
  for (std::size_t i = 0; i < pids_.size(); ++i) {
    if (down_[i]) ::kill(pids_[i], SIGCONT);  // the fixture's SIGKILL works anyway; be tidy
  }
  if (fixturePid_ > 0) ::kill(fixturePid_, SIGTERM);
  if (pipe_) pclose(pipe_);  // waits for the fixture, which waits for its members
}

std::string EtcdTestCluster::endpointList() const {
  std::string out;
  for (const auto& e : endpoints_) out += (out.empty() ? "" : ",") + e;
  return out;
}

std::size_t EtcdTestCluster::leader() {
  EtcdClientOptions o;
  o.endpoints = endpoints_;
  o.callTimeout = std::chrono::milliseconds(500);
  EtcdClient client(o);
  const auto deadline = std::chrono::steady_clock::now() + kElectionBound;
  while (std::chrono::steady_clock::now() < deadline) {
    std::map<uint64_t, std::size_t> ids;
    std::set<uint64_t> leaders;
    for (std::size_t i = 0; i < endpoints_.size(); ++i) {
      if (down_[i]) continue;
      try {
        auto s = client.status(i);
        ids[s.header().member_id()] = i;
        leaders.insert(s.leader());
      } catch (const std::exception&) {
      }
    }
    if (leaders.size() == 1 && ids.count(*leaders.begin())) return ids[*leaders.begin()];
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw std::runtime_error("no agreed etcd leader within the safety bound");
}

void EtcdTestCluster::enableAuth(const std::string& user, const std::string& password) {
  // etcd needs the root user before auth can be enabled; test credentials only, never real ones.
  std::string ctl = "ETCDCTL_API=3 timeout 20 /usr/bin/etcdctl --endpoints=" + endpointList() + " ";
  for (const std::string& cmd : {ctl + "user add root:" + password, ctl + "user grant-role root root",
                                 user == "root" ? std::string("true") : ctl + "user add " + user + ":" + password,
                                 user == "root" ? std::string("true") : ctl + "user grant-role " + user + " root",
                                 ctl + "auth enable"}) {
    if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  }
}

void EtcdTestCluster::compact(int64_t revision) {
  std::string up;
  for (std::size_t i = 0; i < endpoints_.size(); ++i) {
    if (!down_[i]) up += (up.empty() ? "" : ",") + endpoints_[i];
  }
  std::string cmd = "ETCDCTL_API=3 timeout 20 /usr/bin/etcdctl --endpoints=" + up + " compact " +
                    std::to_string(revision) + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

namespace {

// The state letter of a process or thread from its /proc stat file ('?' when it is gone).
char procState(const std::string& statPath) {
  std::ifstream stat(statPath);
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '?';
}

}  // namespace

void EtcdTestCluster::kill(std::size_t member) {
  const pid_t pid = pids_.at(member);
  ::kill(pid, SIGKILL);
  down_[member] = true;
  // As with stop(): the kill is only queued; a test that calls the member right after must find
  // it dead (a zombie until the fixture reaps it, or gone), not answering one last call.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    char state = procState("/proc/" + std::to_string(pid) + "/stat");
    if (state == 'Z' || state == 'X' || state == '?') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void EtcdTestCluster::stop(std::size_t member) {
  const pid_t pid = pids_.at(member);
  ::kill(pid, SIGSTOP);
  down_[member] = true;
  // kill() only queues the stop: a thread running on another CPU may still answer a request
  // sent right after (seen under load: a "frozen" leader served a put). Wait until every thread
  // is stopped (state T), bounded.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      char state = procState(task.path() / "stat");
      if (state != 'T' && state != 't' && state != '?') all = false;
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void EtcdTestCluster::cont(std::size_t member) {
  ::kill(pids_.at(member), SIGCONT);
  down_[member] = false;
}

}  // namespace ddprun::test
