#include "etcd/etcd_watch.h"

#include <grpcpp/client_context.h>

#include <atomic>

#include "common/backoff.h"
#include "common/error.h"
#include "etcd/etcd_client.h"

namespace ddprun {

namespace {
int64_t SteadyClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

EtcdWatch::EtcdWatch(EtcdClient& client, std::string key, std::string rangeEnd, int64_t afterRevision)
    : client_(client),
      key_(std::move(key)),
      rangeEnd_(std::move(rangeEnd)),
      nextRevision_(afterRevision == kFromNow ? 0 : afterRevision + 1),
      startedAfter_(afterRevision == kFromNow ? 0 : afterRevision) {
  reader_ = std::thread([this] { run(); });
}

EtcdWatch::~EtcdWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  reader_.join();
}

std::vector<mvccpb::Event> EtcdWatch::next(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_until(lock, deadline, [&] { return !events_.empty() || error_; });
  if (events_.empty() && error_) std::rethrow_exception(error_);
  std::vector<mvccpb::Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

std::optional<int64_t> EtcdWatch::startedAfter(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_until(lock, deadline, [&] { return startedAfter_ > 0 || error_; });
  if (startedAfter_ > 0) return startedAfter_;
  if (error_) std::rethrow_exception(error_);
  return std::nullopt;
}

void EtcdWatch::run() {
  using Clock = std::chrono::steady_clock;
  auto failingSince = Clock::now();
  Backoff backoff(std::chrono::milliseconds(10), std::chrono::milliseconds(500));
  for (;;) {
    std::size_t endpoint = client_.currentEndpoint();
    if (streamOnce(endpoint)) {
      failingSince = Clock::now();
      backoff.reset();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_ || error_) return;
    client_.markFailed(endpoint);
    if (Clock::now() - failingSince > client_.options().retryTimeout) {
      error_ = std::make_exception_ptr(ConnectionError("etcd watch on '" + key_ + "': no member carried it for " +
                                                       std::to_string(client_.options().retryTimeout.count()) + " ms"));
      cv_.notify_all();
      return;
    }
    cv_.wait_for(lock, backoff.next(), [&] { return stopping_; });
    if (stopping_) return;
  }
}

bool EtcdWatch::streamOnce(std::size_t endpoint) {
  grpc::ClientContext context;
  client_.prepare(context);
  etcdserverpb::WatchRequest req;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    context_ = &context;
    auto* create = req.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(rangeEnd_);
    if (nextRevision_ > 0) create->set_start_revision(nextRevision_);  // else from now
  }
  auto stream = client_.watchStub(endpoint).Watch(&context);
  bool created = false;
  if (stream->Write(req)) {
    // A frozen member keeps the stream open and silent. The prober asks for progress
    // (WatchProgressRequest: etcd answers with its revision) after watchProbe of silence, and
    // cancels the stream when no answer came within watchProbe more; the loop below then moves
    // the watch to another member. Without it only gRPC's keepalive (>= 8 s) would notice.
    const auto probe = client_.options().watchProbe;
    std::atomic<int64_t> heardNs{SteadyClockNs()};
    std::mutex probeMu;
    std::condition_variable probeCv;
    bool probeDone = false;
    std::thread prober;
    if (probe.count() > 0) {
      prober = std::thread([&] {
        std::unique_lock<std::mutex> lock(probeMu);
        bool asked = false;
        while (!probeCv.wait_for(lock, probe / 2, [&] { return probeDone; })) {
          auto silent = std::chrono::nanoseconds(SteadyClockNs() - heardNs.load());
          if (silent < probe) {
            asked = false;
          } else if (!asked) {
            etcdserverpb::WatchRequest progress;
            progress.mutable_progress_request();
            asked = true;
            if (!stream->Write(progress)) break;
          } else if (silent >= 2 * probe) {
            context.TryCancel();
            break;
          }
        }
      });
    }
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      heardNs = SteadyClockNs();
      std::lock_guard<std::mutex> lock(mutex_);
      if (resp.created()) {
        created = true;
        if (nextRevision_ == 0) {  // from now: etcd delivers every change after its revision now
          startedAfter_ = resp.header().revision();
          nextRevision_ = startedAfter_ + 1;
          cv_.notify_all();
        }
      }
      if (resp.compact_revision() > 0) {
        error_ = std::make_exception_ptr(EtcdCompacted("etcd watch on '" + key_ + "': revision " +
                                                       std::to_string(nextRevision_) + " was compacted (now " +
                                                       std::to_string(resp.compact_revision()) + ")"));
        cv_.notify_all();
        break;
      }
      if (resp.canceled()) break;  // e.g. the member lost its leader: go on elsewhere
      for (auto& ev : *resp.mutable_events()) {
        nextRevision_ = ev.kv().mod_revision() + 1;
        events_.push_back(std::move(ev));
      }
      if (resp.events_size() > 0) cv_.notify_all();
    }
    if (prober.joinable()) {
      {
        std::lock_guard<std::mutex> lock(probeMu);
        probeDone = true;
      }
      probeCv.notify_all();
      prober.join();
    }
  }
  context.TryCancel();
  stream->Finish();
  std::lock_guard<std::mutex> lock(mutex_);
  context_ = nullptr;
  return created;
}

}  // namespace ddprun
