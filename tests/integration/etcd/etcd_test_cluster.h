// A real 3-member etcd cluster for a C++ test case: scripts/etcd_cluster.py serve, started as a
// child and ended (SIGTERM; it kills every member by PID and removes its folder) when this object
// goes. The script also ends with the thread that started it (PR_SET_PDEATHSIG) and after a
// safety bound (--ttl), so a crashed test leaves nothing behind.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ddprun {
class EtcdClient;
}

namespace ddprun::test {

class EtcdTestCluster {
 public:
  // Why no cluster can run here (etcd not installed), or empty.
  static std::string unavailableReason();

  EtcdTestCluster();  // throws std::runtime_error when the cluster does not come up
  ~EtcdTestCluster();
  EtcdTestCluster(const EtcdTestCluster&) = delete;
  EtcdTestCluster& operator=(const EtcdTestCluster&) = delete;

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  std::string endpointList() const;  // "h:p,h:p,h:p"
  // The index of the member that leads now, as the live members agree (waits for an election,
  // up to a safety bound).
  std::size_t leader();
  void kill(std::size_t member);  // SIGKILL
  void stop(std::size_t member);  // SIGSTOP
  void cont(std::size_t member);  // SIGCONT
  // Adds etcd user `user` (with the root role) and turns authentication on (etcdctl).
  void enableAuth(const std::string& user, const std::string& password);
  // Compacts the key space up to `revision` through the members that are up (etcdctl).
  void compact(int64_t revision);

 private:
  FILE* pipe_ = nullptr;
  pid_t fixturePid_ = -1;
  std::vector<std::string> endpoints_;
  std::vector<pid_t> pids_;
  std::vector<bool> down_;
};

}  // namespace ddprun::test
