#include "store/forward/forwarding_sink.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddprun/v1/store.pb.h"
#include "store/core/store_status.h"

namespace ddprun {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

v1::StoreResponse failed(uint64_t id, StoreCode code, std::string message) {
  v1::StoreResponse response;
  response.set_id(id);
  response.mutable_status()->set_code(static_cast<int32_t>(code));
  response.mutable_status()->set_message(std::move(message));
  return response;
}

int32_t codeOf(const v1::StoreResponse& response) {
  return response.has_status() ? response.status().code() : 0;
}

// The store's timeout reads "timed out after <ms> ms waiting for ..." (StoreCore::waitFailure);
// after slicing it names the last slice, so it is made to name the request's own timeout, as the
// store would have. Any other message (the client's deadline) is left as it is.
void nameWholeTimeout(v1::StoreResponse& response, uint32_t timeoutMs) {
  constexpr std::string_view kPrefix = "timed out after ";
  const std::string& message = response.status().message();
  const std::size_t at = message.find(kPrefix);  // "store: timed out after" from etcd's store
  if (at == std::string::npos) return;
  std::size_t end = at + kPrefix.size();
  while (end < message.size() && message[end] >= '0' && message[end] <= '9') ++end;
  if (end == at + kPrefix.size()) return;
  response.mutable_status()->set_message(message.substr(0, at) + std::string(kPrefix) + std::to_string(timeoutMs) +
                                         message.substr(end));
}

}  // namespace

// What the forwarder and its sinks share: a sink (and a factory) may outlive the forwarder, and
// the threads are joined by whoever starts the next one or stops, never by themselves.
struct StoreForwarder::Shared {
  explicit Shared(StoreForwarderOptions o) : options(std::move(o)) {
    if (options.name.empty()) options.name = options.client.address;
    if (!options.call) {
      client.emplace(options.client);
      options.call = [this](v1::StoreRequest& request, milliseconds timeout) { return client->call(request, timeout); };
    }
  }

  // Registers a new sink for stop(); false once stopped.
  bool addSink(const std::shared_ptr<Sink>& sink) {
    std::lock_guard lock(mutex);
    if (stopped) return false;
    std::erase_if(sinks, [](const std::weak_ptr<Sink>& s) { return s.expired(); });
    sinks.push_back(sink);
    return true;
  }

  // Starts `sink`'s thread, after joining the threads that finished; false once stopped.
  bool startThread(const std::shared_ptr<Sink>& sink);

  // The last thing a thread does: marks itself for the next reaper to join.
  void finished(uint64_t worker) {
    std::lock_guard lock(mutex);
    auto it = workers.find(worker);
    if (it != workers.end()) it->second.done = true;  // stop() may have taken it already
  }

  struct Worker {
    std::thread thread;
    bool done = false;
  };

  StoreForwarderOptions options;    // set once, in the constructor
  std::optional<StoreClient> client;  // when options.call was not given

  std::mutex stopMutex;  // held through stop(): a concurrent stop() returns when all is joined
  std::mutex mutex;      // guards what follows
  bool stopped = false;
  std::vector<std::weak_ptr<Sink>> sinks;
  std::unordered_map<uint64_t, Worker> workers;
  uint64_t nextWorker = 1;
};

class StoreForwarder::Sink final : public StoreRequestSink, public std::enable_shared_from_this<Sink> {
 public:
  Sink(std::shared_ptr<Shared> shared, Respond respond) : shared_(std::move(shared)), respond_(std::move(respond)) {}

  void handle(v1::StoreRequest& request) override {
    const uint64_t id = request.id();
    bool start = false;
    {
      std::unique_lock lock(mutex_);
      if (ended_) return;
      if (queue_.size() >= shared_->options.maxQueuedPerSink) {
        lock.unlock();  // never answer with a lock held: the adapter's respond takes its own
        respond_(failed(id, StoreCode::kResourceExhausted,
                        "too many store requests queued on one connection (limit " +
                            std::to_string(shared_->options.maxQueuedPerSink) + ")"));
        return;
      }
      queue_.emplace_back();
      queue_.back().Swap(&request);  // its values may be moved out: no copy
      start = !started_;
      started_ = true;
    }
    if (!start) {
      cv_.notify_one();
      return;
    }
    if (shared_->startThread(shared_from_this())) return;
    // The forwarder stopped: there is no store to send to.
    {
      std::lock_guard lock(mutex_);
      queue_.clear();
      started_ = false;
      if (ended_) return;  // stop() ended this sink meanwhile: no answer
    }
    respond_(failed(id, StoreCode::kUnavailable, "the store forwarder at " + shared_->options.name +
                                                     " has stopped"));
  }

  void end() override {
    {
      std::lock_guard lock(mutex_);
      if (ended_) return;
      ended_ = true;
      queue_.clear();
    }
    cv_.notify_all();
  }

  // The sink's thread: one request at a time, in order, until end().
  void run() {
    for (;;) {
      v1::StoreRequest request;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return ended_ || !queue_.empty(); });
        if (ended_) return;
        request.Swap(&queue_.front());
        queue_.pop_front();
      }
      std::optional<v1::StoreResponse> response = forward(request);
      if (!response || ended()) return;  // the in-flight answer of an ended sink is dropped
      respond_(std::move(*response));
    }
  }

  const std::shared_ptr<Shared>& shared() const { return shared_; }

 private:
  bool ended() {
    std::lock_guard lock(mutex_);
    return ended_;
  }

  // Sends `request` to the store; nullopt when the sink ended during a sliced wait.
  std::optional<v1::StoreResponse> forward(v1::StoreRequest& request) {
    const uint64_t id = request.id();
    const milliseconds slice = std::max(shared_->options.waitSlice, milliseconds(1));
    v1::StoreResponse response;
    if (request.has_get() || request.has_wait()) {
      const uint32_t total = request.has_get() ? request.get().timeout_ms() : request.wait().timeout_ms();
      if (milliseconds(total) <= slice) {
        response = shared_->options.call(request, milliseconds(total));
      } else {
        auto sliced = slicedWait(request, total, slice);
        if (!sliced) return std::nullopt;
        response = std::move(*sliced);
      }
    } else {
      response = shared_->options.call(request, shared_->options.client.timeout);
    }
    response.set_id(id);  // the client's id was the transport's
    return response;
  }

  // A wait longer than a slice, a slice at a time: the remote wait cannot be cancelled, so this
  // thread looks at end() between slices. nullopt when the sink ended.
  std::optional<v1::StoreResponse> slicedWait(v1::StoreRequest& request, uint32_t total, milliseconds slice) {
    const auto deadline = Clock::now() + milliseconds(total);
    for (;;) {
      const auto left = std::max(std::chrono::ceil<milliseconds>(deadline - Clock::now()), milliseconds(0));
      const auto part = std::min(slice, left);
      const auto partMs = static_cast<uint32_t>(part.count());
      if (request.has_get()) {
        request.mutable_get()->set_timeout_ms(partMs);
      } else {
        request.mutable_wait()->set_timeout_ms(partMs);
      }
      v1::StoreResponse response = shared_->options.call(request, part);
      if (ended()) return std::nullopt;
      if (codeOf(response) != static_cast<int32_t>(StoreCode::kDeadlineExceeded)) return response;
      if (Clock::now() >= deadline) {
        nameWholeTimeout(response, total);
        return response;
      }
    }
  }

  const std::shared_ptr<Shared> shared_;
  const Respond respond_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<v1::StoreRequest> queue_;
  bool ended_ = false;
  bool started_ = false;  // its thread was started
};

bool StoreForwarder::Shared::startThread(const std::shared_ptr<Sink>& sink) {
  std::vector<std::thread> reaped;
  bool started = false;
  {
    std::lock_guard lock(mutex);
    if (!stopped) {
      for (auto it = workers.begin(); it != workers.end();) {
        // A finished thread has only to return; never join the calling thread itself.
        if (it->second.done && it->second.thread.get_id() != std::this_thread::get_id()) {
          reaped.push_back(std::move(it->second.thread));
          it = workers.erase(it);
        } else {
          ++it;
        }
      }
      const uint64_t worker = nextWorker++;
      // Entered before the thread exists, so that its finished() always finds it.
      workers[worker].thread = std::thread([sink, worker] {
        sink->run();
        sink->shared()->finished(worker);
      });
      started = true;
    }
  }
  for (auto& t : reaped) t.join();
  return started;
}

StoreForwarder::StoreForwarder(StoreForwarderOptions options)
    : shared_(std::make_shared<Shared>(std::move(options))) {}

StoreForwarder::~StoreForwarder() { stop(); }

std::shared_ptr<StoreRequestSink> StoreForwarder::makeSink(StoreRequestSink::Respond respond) {
  return factory()(std::move(respond));
}

StoreRequestSink::Factory StoreForwarder::factory() {
  return [shared = shared_](StoreRequestSink::Respond respond) -> std::shared_ptr<StoreRequestSink> {
    auto sink = std::make_shared<Sink>(shared, std::move(respond));
    shared->addSink(sink);  // once stopped: not registered, and its handle() answers UNAVAILABLE
    return sink;
  };
}

void StoreForwarder::stop() {
  std::lock_guard stopLock(shared_->stopMutex);
  std::vector<std::weak_ptr<Sink>> sinks;
  std::unordered_map<uint64_t, Shared::Worker> workers;
  {
    std::lock_guard lock(shared_->mutex);
    shared_->stopped = true;  // no thread starts after this
    sinks.swap(shared_->sinks);
    workers.swap(shared_->workers);
  }
  for (auto& weak : sinks) {
    if (auto sink = weak.lock()) sink->end();
  }
  for (auto& [id, worker] : workers) {
    if (worker.thread.get_id() == std::this_thread::get_id()) {
      worker.thread.detach();  // stop() from a sink's own answer: it returns by itself
    } else {
      worker.thread.join();
    }
  }
}

}  // namespace ddprun
