#include "worker_sdk/recovery.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/strings.h"
#include "worker_sdk/heartbeat.h"
#include "worker_sdk/recovery_notice.h"
#include "worker_sdk/remote_store.h"

extern char** environ;

namespace ddp {

bool inProcessRecoveryRequested() {
  const char* value = std::getenv("DDPRUN_RECOVERY");
  return value != nullptr && std::string_view(value) == "in_process";
}

bool isWarmSpare() {
  const char* value = std::getenv("DDPRUN_SPARE");
  return value != nullptr && std::string_view(value) == "1";
}

std::optional<Env> waitAsSpare(const std::map<std::string, std::string>& vars,
                               std::optional<std::chrono::milliseconds> timeout) {
  const auto get = [&](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
  const auto fd = ddprun::parseInt(get("DDPRUN_HEARTBEAT_FD"));
  const auto round = ddprun::parseInt(get("DDPRUN_ROUND"));
  NoticeReader reader(NoticeReaderOptions{.fd = fd && *fd >= 0 && *fd <= INT_MAX ? static_cast<int>(*fd) : -1,
                                          .currentRound = round && *round > 0 ? static_cast<uint64_t>(*round) : 0});
  const auto start = std::chrono::steady_clock::now();
  while (reader.available()) {
    auto slice = std::chrono::milliseconds(std::chrono::hours(1));
    if (timeout) {
      const auto left = *timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start);
      if (left.count() <= 0) break;
      slice = std::min(slice, left);
    }
    if (auto notice = reader.wait(slice)) return spareRecoveryEnv(vars, *notice);
  }
  return std::nullopt;
}

std::optional<Env> waitAsSpare(std::optional<std::chrono::milliseconds> timeout) {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view text(*entry);
    const auto eq = text.find('=');
    if (eq != std::string_view::npos) vars.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return waitAsSpare(vars, timeout);
}

// What the round's monitor thread and the training thread share: the committed step, the
// heartbeat (one thread at a time: under mutex_), the notice the monitor took.
class RecoveryContext::Impl {
 public:
  // reader and communicator null: no monitor (a run outside in-process recovery), commit() beats.
  Impl(Heartbeat& heartbeat, NoticeReader* reader, Communicator* communicator, int64_t committed,
       const RecoverableOptions& options)
      : heartbeat_(heartbeat), reader_(reader), communicator_(communicator), committed_(committed),
        interval_(std::max(options.monitorInterval, std::chrono::milliseconds(1))),
        beatInterval_(options.beatInterval) {
    if (reader_ && communicator_) thread_ = std::thread([this] { monitor(); });
  }
  ~Impl() { stop(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void commit(int64_t step) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      committed_ = step;
      heartbeat_.beat(step);
    }
    if (noticed_.load()) throw RoundOver("round over: ddprun announced a new round (in-process recovery)");
  }

  void setCommitted(int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    committed_ = step;
  }
  int64_t committed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return committed_;
  }

  // Ends the monitor; afterwards the reader and the heartbeat are the caller's alone again.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The notice the monitor took (call after stop()).
  std::optional<RecoveryNotice> takeNotice() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(notice_, std::nullopt);
  }

 private:
  void monitor() {
    auto lastBeat = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, interval_, [this] { return stopping_; });
      if (stopping_) break;
      // The reader is this thread's alone while it runs: read it without the lock, so that a
      // commit() never waits for a read.
      lock.unlock();
      auto notice = reader_->poll();
      lock.lock();
      if (notice) {
        notice_ = std::move(notice);
        noticed_ = true;
        // Aborting fails the collective the training thread may be blocked in (a dead peer's);
        // outside the lock, as the abort may take the backend's own locks.
        lock.unlock();
        communicator_->abort();
        lock.lock();
      }
      // Alive while waiting on its peers (a collective in Work::wait): not the hung rank. A rank
      // busy in its own code beats only when it commits, so that a rank hung there falls silent,
      // as the Python API's (it beats only while its main thread waits in torch).
      const auto now = std::chrono::steady_clock::now();
      if (now - lastBeat >= beatInterval_ && detail::waitingOnWork(trainer_)) {
        heartbeat_.beat(committed_);
        lastBeat = now;
      }
    }
  }

  Heartbeat& heartbeat_;
  const std::thread::id trainer_ = std::this_thread::get_id();  // made on the thread that runs train()
  NoticeReader* const reader_;
  Communicator* const communicator_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int64_t committed_;
  std::optional<RecoveryNotice> notice_;
  std::atomic<bool> noticed_{false};
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds beatInterval_;
  std::thread thread_;
};

void RecoveryContext::commit(int64_t step) { impl_->commit(step); }

namespace {

CommunicatorOptions roundOptions(const RecoverableOptions& options, uint64_t round) {
  CommunicatorOptions out = options.communicator;
  out.name += ".round" + std::to_string(round);
  return out;
}

std::shared_ptr<Store> roundStore(const RecoverableOptions& options, const Env& env) {
  if (options.makeStore) return options.makeStore(env);
  return makeStore(env, options.storeTimeout);
}

// Whether `error` says that a peer or the round failed, not this rank's own code: RoundOver, and
// the errors of communicators and stores (a closed connection, a timeout, an aborted
// communicator, gloo's and NCCL's own failures).
bool peerFailure(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const RoundOver&) {
    return true;
  } catch (const ddprun::TimeoutError&) {
    return true;
  } catch (const ddprun::ConnectionError&) {
    return true;
  } catch (const ddprun::ClosedError&) {
    return true;
  } catch (const ddprun::StateError&) {
    return true;
  } catch (const ddprun::ConfigError&) {
    return false;
  } catch (const ddprun::Error& e) {
    const std::string_view what = e.what();
    return what.substr(0, 5) == "gloo " || what.substr(0, 5) == "nccl ";
  } catch (...) {
    return false;
  }
}

// Every rank's committed step; the lowest rank with the highest sends its state, size first,
// which the others load. Host values through allReduceHost and a staging buffer: any backend.
int64_t agreeOnState(Communicator& comm, int64_t committed, const RecoveryState& state, std::size_t maxBytes) {
  int64_t best = committed;
  comm.allReduceHost(&best, 1, DataType::kInt64, ReduceOp::kMax);
  int64_t source = committed == best ? comm.rank() : std::numeric_limits<int64_t>::max();
  comm.allReduceHost(&source, 1, DataType::kInt64, ReduceOp::kMin);
  std::string bytes;
  if (comm.rank() == source && state.save) bytes = state.save();
  int64_t size = comm.rank() == source ? static_cast<int64_t>(bytes.size()) : 0;
  comm.allReduceHost(&size, 1, DataType::kInt64, ReduceOp::kSum);  // only the source adds
  if (size < 0 || static_cast<uint64_t>(size) > maxBytes) {
    throw ddprun::ConfigError("in-process recovery: rank " + std::to_string(source) + "'s state of " +
                              std::to_string(size) + " bytes is over RecoverableOptions::maxStateBytes");
  }
  if (size > 0) {
    // Broadcast moves elements without arithmetic: bytes travel as int64 words, zero-padded.
    const std::size_t words = (static_cast<std::size_t>(size) + 7) / 8;
    std::vector<char> host(words * 8, 0);
    if (comm.rank() == source) std::memcpy(host.data(), bytes.data(), bytes.size());
    auto staging = comm.makeStagingBuffer(host.size());
    staging->copyFromHost(host.data(), host.size(), 0);
    comm.broadcast(staging->data(), staging->data(), words, DataType::kInt64, static_cast<int>(source));
    staging->copyToHost(host.data(), host.size(), 0);
    bytes.assign(host.data(), static_cast<std::size_t>(size));
  }
  if (comm.rank() != source && state.load) state.load(bytes);
  return best;
}

// Waits up to the timeout for the next round's notice, beating meanwhile (this rank is alive);
// `latest`: one the monitor already took. Then the newest pending.
std::optional<RecoveryNotice> waitForNotice(NoticeReader& reader, Heartbeat& heartbeat, int64_t committed,
                                            const RecoverableOptions& options,
                                            std::optional<RecoveryNotice> latest) {
  const auto deadline = std::chrono::steady_clock::now() + options.noticeTimeout;
  const auto slice = std::max(options.beatInterval, std::chrono::milliseconds(1));
  while (!latest && reader.available()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    latest = reader.wait(std::min(left, slice));
    heartbeat.beat(committed);
  }
  if (auto newer = reader.poll(); newer && (!latest || newer->round >= latest->round)) latest = std::move(newer);
  return latest;
}

}  // namespace

int runRecoverable(const RecoverableOptions& options, const std::function<void(RecoveryContext&)>& train,
                   const RecoveryState& state) {
  const bool inProcess = options.inProcess.value_or(inProcessRecoveryRequested());
  NoticeReader reader(NoticeReaderOptions{.fd = options.env.heartbeatFd, .currentRound = options.env.round});
  if (!inProcess || !reader.available()) {
    // Not recovered in place: one round, errors go through, as without runRecoverable().
    Heartbeat heartbeat(options.env);
    auto store = roundStore(options, options.env);
    auto comm = makeCommunicator(options.backend, options.env, *store, roundOptions(options, options.env.round));
    RecoveryContext::Impl impl(heartbeat, nullptr, nullptr, 0, options);
    RecoveryContext ctx(options.env, 0, *comm, &impl);
    train(ctx);
    return 0;
  }

  // A survivor writes to a dead peer's connection (a transport's write without MSG_NOSIGNAL): that
  // must be an error the round's teardown handles, not a SIGPIPE that kills the process and turns
  // the recovery into a restart of every rank. Ignored for the process, as Python does, unless the
  // program installed a handler of its own.
  struct sigaction pipe {};
  if (::sigaction(SIGPIPE, nullptr, &pipe) == 0 && pipe.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
  Env env = options.env;
  std::optional<Heartbeat> heartbeat(std::in_place, env);
  heartbeat->setRecoverable(true);  // opt in at once: a peer's failure must leave this rank running
  int64_t committed = 0;
  int recoveries = 0;
  for (;;) {
    std::unique_ptr<Communicator> comm;
    std::optional<RecoveryNotice> notice;
    std::exception_ptr error;
    try {
      auto store = roundStore(options, env);
      comm = makeCommunicator(options.backend, env, *store, roundOptions(options, env.round));
      RecoveryContext::Impl impl(*heartbeat, &reader, comm.get(), committed, options);
      try {
        const int64_t agreed = agreeOnState(*comm, committed, state, options.maxStateBytes);
        impl.setCommitted(agreed);
        RecoveryContext ctx(env, agreed, *comm, &impl);
        train(ctx);
      } catch (...) {
        impl.stop();
        committed = impl.committed();
        notice = impl.takeNotice();
        throw;
      }
      impl.stop();
      comm.reset();  // a clean destroy: issued work finishes
      heartbeat->setRecoverable(false);
      return recoveries;
    } catch (...) {
      error = std::current_exception();
    }
    // The round is over for this rank: peers blocked on it fail at once (its connections close)
    // instead of waiting out their timeout.
    if (comm) {
      comm->abort();
      comm.reset();
    }
    if (!notice && !peerFailure(error)) heartbeat->reportFailed();  // the agent replaces this rank
    notice = waitForNotice(reader, *heartbeat, committed, options, std::move(notice));
    if (!notice || recoveries >= options.maxRecoveries) std::rethrow_exception(error);
    ++recoveries;
    const int oldRank = env.rank;
    env = applyRecoveryNotice(env, *notice);
    reader.setCurrentRound(notice->round);
    if (env.rank != oldRank) {
      heartbeat.reset();  // beats name the rank: the next ones the new one
      heartbeat.emplace(env);
      heartbeat->setRecoverable(true);
    }
  }
}

}  // namespace ddp
