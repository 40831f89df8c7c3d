// The job's store through torch's TCPStore protocol (torch 2.x's dialect, store/tcpstore/): what
// a libddp worker uses when its agent serves torch's store on this node
// (DDPRUN_STORE_ADDR=tcpstore://127.0.0.1:PORT: a single-node job whose agent serves torch's
// store, agent/torch_store.h). A libddp rank and a torch rank of one job then read and write the
// same keys, as they do across nodes through the job's store. torch's client sends its key K as
// "/K"; this one sends keys as given, so a libddp rank reads torch's key K as "/K".
//
// The protocol carries no credential: the agent admits a connection by the process at its other
// end (a worker of the current attempt), and binds it to that attempt's round. It has no error
// reply either: a refusal (a stranger, a stale round, a key over the store's limits) closes the
// connection, which this class reports as ConnectionError at the call that finds it closed (a set,
// which the protocol does not answer, at the next call). One connection, one call at a time, as
// torch's client: a thread in get() or wait() holds it until the key comes or the timeout.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "worker_sdk/store.h"

namespace ddp {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;  // get() and wait(); every answer
  std::chrono::milliseconds connectTimeout = std::chrono::seconds(30);
};

class TcpStore final : public Store {
 public:
  // Connects (retrying a refused connection up to connectTimeout), opens the connection as torch
  // 2.x's client does (VALIDATE, then a PING whose nonce must come back) and so learns whether
  // the agent admitted this process. ConnectionError when it cannot.
  explicit TcpStore(TcpStoreOptions options);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

 private:
  using Clock = std::chrono::steady_clock;
  void send(const std::string& bytes);
  // Reads exactly n bytes by `deadline`; false when the deadline passed first.
  bool recvBy(char* out, std::size_t n, Clock::time_point deadline);
  void recvAnswer(char* out, std::size_t n, const char* what);
  int64_t recvI64(const char* what);
  std::string recvBytes(const char* what);
  bool checkLocked(const std::vector<std::string>& keys);
  void waitLocked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  [[noreturn]] void fail(const std::string& why);

  TcpStoreOptions options_;
  std::mutex mu_;  // one command and its answer at a time: the protocol has no request ids
  ddprun::UniqueFd fd_;
};

}  // namespace ddp
