#include "worker_sdk/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/flight_record.h"
#include "worker_sdk/work_state.h"

namespace ddp::detail {
namespace {

namespace flight = ddprun::flight;

int64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Delegates to the backend's state; marks the collective finished the first time it is seen so.
class RecordingWork final : public WorkState {
 public:
  RecordingWork(Work inner, uint64_t seq) : inner_(std::move(inner)), seq_(seq) {}
  void wait() override {
    try {
      inner_.wait();
    } catch (...) {
      mark(false);
      throw;
    }
    mark(true);
  }
  bool isCompleted() override {
    bool done = inner_.isCompleted();
    if (done) mark(true);  // a failure shows when it is waited on
    return done;
  }

 private:
  void mark(bool ok) {
    if (!marked_.exchange(true)) FlightRecorder::instance()->finished(seq_, ok);
  }
  Work inner_;
  uint64_t seq_;
  std::atomic<bool> marked_{false};
};

}  // namespace

FlightRecorder* FlightRecorder::instance() {
  static FlightRecorder* recorder = [] {
    const char* path = std::getenv("DDPRUN_FLIGHT_RECORDER");
    const char* rank = std::getenv("RANK");
    if (!path || !*path) return static_cast<FlightRecorder*>(nullptr);
    auto* r = new FlightRecorder(path, rank ? std::atoi(rank) : -1);  // lives as long as the process
    return r->enabled() ? r : nullptr;
  }();
  return recorder;
}

FlightRecorder::FlightRecorder(const std::string& path, int rank) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  void* p = MAP_FAILED;
  if (::ftruncate(fd, sizeof(flight::File)) == 0) {
    p = ::mmap(nullptr, sizeof(flight::File), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (p == MAP_FAILED) return;
  auto* file = static_cast<flight::File*>(p);
  file->capacity = flight::kCapacity;
  file->rank = rank;
  std::atomic_ref<uint64_t>(file->magic).store(flight::kMagic, std::memory_order_release);
  file_ = file;
}

FlightRecorder::~FlightRecorder() {
  if (file_) ::munmap(file_, sizeof(flight::File));
}

uint64_t FlightRecorder::started(const char* op, uint64_t bytes) noexcept {
  if (!file_) return 0;
  auto* file = static_cast<flight::File*>(file_);
  const uint64_t seq = std::atomic_ref<uint64_t>(next_).fetch_add(1, std::memory_order_relaxed) + 1;
  flight::Entry& e = file->entries[(seq - 1) % flight::kCapacity];
  std::atomic_ref<uint64_t> slotSeq(e.seq);
  slotSeq.store(0, std::memory_order_relaxed);  // being rewritten: the agent skips it
  std::atomic_thread_fence(std::memory_order_release);
  e.bytes = bytes;
  e.startedNs = monotonicNs();
  std::atomic_ref<uint32_t>(e.state).store(static_cast<uint32_t>(flight::State::kStarted), std::memory_order_relaxed);
  std::memset(e.op, 0, sizeof(e.op));
  std::strncpy(e.op, op, sizeof(e.op) - 1);
  slotSeq.store(seq, std::memory_order_release);
  return seq;
}

void FlightRecorder::finished(uint64_t seq, bool ok) noexcept {
  if (!file_ || seq == 0) return;
  auto* file = static_cast<flight::File*>(file_);
  flight::Entry& e = file->entries[(seq - 1) % flight::kCapacity];
  if (std::atomic_ref<uint64_t>(e.seq).load(std::memory_order_acquire) != seq) return;  // overwritten since
  std::atomic_ref<uint32_t>(e.state).store(
      static_cast<uint32_t>(ok ? flight::State::kCompleted : flight::State::kFailed), std::memory_order_release);
}

Work recordedWork(Work work, uint64_t seq) { return Work(std::make_shared<RecordingWork>(std::move(work), seq)); }

}  // namespace ddp::detail
