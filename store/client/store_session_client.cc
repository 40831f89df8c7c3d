#include "store/client/store_session_client.h"

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/backoff.h"
#include "common/error.h"
#include "rpc/grpc_util.h"

namespace ddprun::detail {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kFirstBackoff{20};
constexpr milliseconds kMaxBackoff{1000};
// The watchdog looks at the calls in flight at least this often while any are.
constexpr milliseconds kWatchdogTick{1000};

v1::StoreResponse failed(uint64_t id, grpc::StatusCode code, const std::string& message) {
  v1::StoreResponse response;
  response.set_id(id);
  response.mutable_status()->set_code(static_cast<int32_t>(code));
  response.mutable_status()->set_message(message);
  return response;
}

}  // namespace

// One caller waiting for its response; lives on the caller's stack. Guarded by mutex_.
struct StoreSessionClient::Waiter {
  uint64_t id = 0;
  Clock::time_point deadline;
  std::condition_variable cv;  // woken for its response, a broken stream, or to become the reader
  bool done = false;
  bool failed = false;    // the stream broke before the response came
  bool timedOut = false;  // the watchdog cancelled the stream because of this call's deadline
  v1::StoreResponse response;
};

// One Session call. The context outlives the stream (declared first, destroyed last).
struct StoreSessionClient::Stream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StoreRequest, v1::StoreResponse>> rw;
  std::mutex writeMutex;  // one Write (or the final Finish) at a time
  // Guarded by the client's mutex_:
  bool broken = false;
  bool cancelled = false;
  bool readerActive = false;
  grpc::Status finalStatus;
  std::unordered_map<uint64_t, Waiter*> waiters;
};

StoreSessionClient::StoreSessionClient(StoreSessionClientOptions options,
                                       std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), channel_(std::move(channel)), stub_(v1::Store::NewStub(channel_)) {
  connect();
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

StoreSessionClient::~StoreSessionClient() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  watchdogCv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard streamLock(streamMutex_);
  if (!current_) return;
  // Cancelling tells the server at once that this client is gone; its pending waits end there.
  current_->context.TryCancel();
  bool broken = false;
  {
    std::lock_guard lock(mutex_);
    broken = current_->broken;  // then its reader already called Finish
  }
  if (!broken) {
    std::lock_guard writeLock(current_->writeMutex);
    current_->rw->Finish();
  }
}

v1::StoreResponse StoreSessionClient::call(v1::StoreRequest& request, Clock::time_point deadline) {
  request.set_id(nextId_.fetch_add(1, std::memory_order_relaxed));
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<Stream> s = stream();
    Waiter waiter;
    waiter.id = request.id();
    waiter.deadline = deadline;
    {
      std::lock_guard lock(mutex_);
      s->waiters.emplace(waiter.id, &waiter);
      if (watchdogIdle_ || deadline - Clock::now() < kWatchdogTick) {
        watchdogIdle_ = false;
        watchdogKick_ = true;
        watchdogCv_.notify_one();
      }
    }
    bool written = false;
    {
      std::lock_guard writeLock(s->writeMutex);
      written = s->rw->Write(request);
    }
    await(*s, waiter);
    if (!waiter.failed) return std::move(waiter.response);
    if (waiter.timedOut) {
      return failed(request.id(), grpc::StatusCode::DEADLINE_EXCEEDED,
                    "no answer before the call's deadline; the store session was cancelled");
    }
    // A request that never left, on a stream that had broken before it (the server restarted
    // while this client was idle), is safe to send again, once. One that left may have run.
    if (!written && attempt == 0 && Clock::now() < deadline) continue;
    grpc::Status status;
    {
      std::lock_guard lock(mutex_);
      status = s->finalStatus;
    }
    if (status.ok()) status = {grpc::StatusCode::UNAVAILABLE, "the store session ended"};
    return failed(request.id(), status.error_code(), status.error_message());
  }
}

void StoreSessionClient::await(Stream& s, Waiter& waiter) {
  std::unique_lock lock(mutex_);
  while (!waiter.done) {
    if (s.readerActive) {
      waiter.cv.wait(lock);
      continue;
    }
    // Nobody reads: this caller does, for everyone, until its own response is in.
    s.readerActive = true;
    lock.unlock();
    v1::StoreResponse response;
    const bool ok = s.rw->Read(&response);
    grpc::Status status;
    if (!ok) {
      std::lock_guard writeLock(s.writeMutex);  // a writer on a dead stream returns at once
      status = s.rw->Finish();
    }
    lock.lock();
    s.readerActive = false;
    if (ok) {
      auto it = s.waiters.find(response.id());
      if (it == s.waiters.end()) continue;  // no one asked: a server that misbehaves
      Waiter* target = it->second;
      s.waiters.erase(it);
      target->response = std::move(response);
      target->done = true;
      if (target != &waiter) target->cv.notify_one();
    } else {
      s.broken = true;
      s.finalStatus = status;
      for (auto& [id, target] : s.waiters) {
        target->done = true;
        target->failed = true;
        if (target != &waiter) target->cv.notify_one();
      }
      s.waiters.clear();
    }
  }
  // Hand the reading on to another caller still waiting, if this one was the reader.
  if (!s.readerActive && !s.waiters.empty()) s.waiters.begin()->second->cv.notify_one();
}

std::shared_ptr<StoreSessionClient::Stream> StoreSessionClient::stream() {
  std::lock_guard streamLock(streamMutex_);
  {
    std::lock_guard lock(mutex_);
    if (current_ && !current_->broken) return current_;
  }
  if (current_) connect();  // the last stream broke: the server may be restarting
  auto s = std::make_shared<Stream>();
  if (!options_.token.empty()) s->context.AddMetadata(kTokenMetadataKey, options_.token);
  // The metadata goes out with the first request instead of in a message of its own.
  s->context.set_initial_metadata_corked(true);
  s->rw = stub_->Session(&s->context);
  std::lock_guard lock(mutex_);
  current_ = s;
  return s;
}

void StoreSessionClient::connect() {
  const auto deadline = Clock::now() + options_.connectTimeout;
  Backoff backoff(kFirstBackoff, kMaxBackoff);
  for (;;) {
    auto state = channel_->GetState(/*try_to_connect=*/true);
    // Let this attempt resolve: IDLE and CONNECTING are on the way to READY or a failure.
    while (state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING) {
      const auto attemptEnd = std::min(deadline, Clock::now() + kMaxBackoff);
      const auto wallEnd = std::chrono::system_clock::now() + (attemptEnd - Clock::now());
      if (!channel_->WaitForStateChange(state, wallEnd)) break;
      state = channel_->GetState(/*try_to_connect=*/true);
    }
    if (state == GRPC_CHANNEL_READY) return;
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      throw ConnectionError("cannot connect to the store at " + options_.address + " within " +
                            std::to_string(options_.connectTimeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff.next(), left));
  }
}

// Wakes at least every kWatchdogTick while calls are in flight, or at the earliest deadline when
// that is sooner. A new call's deadline is normally later than the next wake-up (its timeout plus
// a margin of seconds), so calls need not wake the watchdog; only the first after an idle spell,
// or one with a deadline under a tick away, does.
void StoreSessionClient::watchdogLoop() {
  std::unique_lock lock(mutex_);
  bool idleOnce = false;
  const auto kicked = [&] { return stopping_ || watchdogKick_; };
  while (!stopping_) {
    watchdogKick_ = false;
    const auto now = Clock::now();
    auto wake = now + kWatchdogTick;
    std::shared_ptr<Stream> expired;
    const std::shared_ptr<Stream> s = current_;
    if (s && !s->waiters.empty()) {
      idleOnce = false;
      for (auto& [id, waiter] : s->waiters) {
        if (waiter->deadline <= now) {
          waiter->timedOut = true;
          expired = s;
        } else {
          wake = std::min(wake, waiter->deadline);
        }
      }
    } else if (idleOnce) {
      // Two ticks without a call: sleep until the next one instead of ticking forever.
      watchdogIdle_ = true;
      watchdogCv_.wait(lock, kicked);
      continue;
    } else {
      idleOnce = true;
    }
    if (expired && !expired->cancelled) {
      expired->cancelled = true;
      lock.unlock();
      expired->context.TryCancel();  // the reader's Read returns false; every waiter fails
      lock.lock();
      continue;
    }
    watchdogCv_.wait_until(lock, wake, kicked);
  }
}

}  // namespace ddprun::detail
