// A collective's buffer in the memory its communicator works on, filled from and read back into
// host memory: what lets host-side code (GradientReducer, a loss all-reduce) run on any backend
// without knowing where the backend's buffers live. Made by Communicator::makeStagingBuffer():
// plain host memory for gloo (the copies are memcpy), device memory for nccl (the copies go
// through a pinned host mirror and are enqueued on the communicator's CUDA stream, so they are
// ordered with its collectives and a copy in never waits for the stream).
#pragma once

#include <cstddef>

namespace ddp {

// Where a communicator's collectives read and write.
enum class MemoryKind { kHost, kDevice };
const char* toString(MemoryKind kind);

class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // What to hand to the communicator's collectives (device memory for nccl: never dereference).
  virtual void* data() = 0;
  std::size_t size() const { return size_; }

  // Copies `bytes` from host memory at src into data() + offset, ordered before every collective
  // issued after this call. src must stay unchanged until a later copyToHost() on this buffer
  // returned (CUDA may still be reading pinned host memory). ddprun::ConfigError when the range
  // is outside the buffer; ddprun::Error when the backend's copy fails.
  void copyFromHost(const void* src, std::size_t bytes, std::size_t offset);
  // Copies `bytes` at data() + offset into host memory at dst, ordered after every collective and
  // copy issued before this call; dst holds them when it returns. It has no timeout of its own:
  // wait for those collectives' Works first. Errors as copyFromHost().
  void copyToHost(void* dst, std::size_t bytes, std::size_t offset);

 protected:
  explicit StagingBuffer(std::size_t size) : size_(size) {}
  // The backend's copies, called after the range was checked.
  virtual void doCopyFromHost(const void* src, std::size_t bytes, std::size_t offset) = 0;
  virtual void doCopyToHost(void* dst, std::size_t bytes, std::size_t offset) = 0;

 private:
  void checkRange(const char* what, const void* host, std::size_t bytes, std::size_t offset) const;
  const std::size_t size_;
};

}  // namespace ddp
