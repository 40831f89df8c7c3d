// The NCCL entry points ddprun calls, with nccl.h's signatures, on simulated devices. Ranks meet
// through the folder named in the ncclUniqueId (exchange.h), so they may be threads of one
// process or separate processes started by ddprun. Collectives are stream work: they run on the
// stream's thread, in stream order, after the call returned; a non-blocking communicator
// (config.blocking = 0) reports ncclInProgress from init and finalize until they are done.
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "tests/simgpu/exchange.h"
#include "tests/simgpu/reduce.h"
#include "tests/simgpu/runtime.h"

namespace simgpu {

namespace {

constexpr char kIdMagic[] = "simgpu:";

enum class Kind : int { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter };

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "AllReduce";
    case Kind::kBroadcast: return "Broadcast";
    case Kind::kAllGather: return "AllGather";
    case Kind::kReduceScatter: return "ReduceScatter";
  }
  return "?";
}

// What every rank must agree on for one collective (a mismatch is a usage error, as the hang or
// corruption it causes on real NCCL).
struct Header {
  int kind = 0;
  int type = 0;
  int op = 0;
  int root = 0;
  uint64_t count = 0;
};

std::mutex globalErrorMutex;
std::string globalLastError;

}  // namespace

struct Comm {
  int rank = 0;
  int size = 0;
  int ordinal = 0;  // the CUDA device current at init
  int device = 0;   // its physical simulated device
  bool blocking = true;
  std::unique_ptr<FileExchange> exchange;
  std::mutex exchangeMutex;  // one collective at a time talks to the peers

  std::mutex mutex;
  ncclResult_t state = ncclInProgress;  // ncclCommGetAsyncError
  std::string lastError;
  long issued = 0;
  TaskPtr lastTask;
  bool finalizing = false;
  std::atomic<bool> aborted{false};

  void fail(ncclResult_t rc, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (state == ncclSuccess || state == ncclInProgress) state = rc;
      if (lastError.empty()) lastError = why;
    }
    std::lock_guard<std::mutex> lock(globalErrorMutex);
    globalLastError = why;
  }
  // A kernel that cannot finish (hung, or its peers failed) ends only when the comm is aborted.
  void waitAborted() const {
    while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

}  // namespace simgpu

// The opaque handle of nccl.h. A handle stays allocated after destroy or abort (a few bytes), so
// that a later call with it is reported instead of touching freed memory.
struct ncclComm {
  std::shared_ptr<simgpu::Comm> comm;
  std::atomic<bool> dead{false};
};

namespace simgpu {

namespace {

ncclResult_t usage(ncclResult_t rc, const std::string& why, Comm* comm = nullptr) {
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    comm->lastError = why;
  }
  std::lock_guard<std::mutex> lock(globalErrorMutex);
  globalLastError = why;
  return rc;
}

// The live state behind a handle, or null (and the reason recorded) for null or dead handles.
std::shared_ptr<Comm> live(ncclComm_t handle, const char* call) {
  if (!handle) {
    usage(ncclInvalidArgument, std::string(call) + ": comm is NULL");
    return nullptr;
  }
  if (handle->dead.load()) {
    usage(ncclInvalidArgument, std::string(call) + ": the communicator was already destroyed or aborted");
    return nullptr;
  }
  return handle->comm;
}

void runInit(const std::shared_ptr<Comm>& comm) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string hello = std::string(host) + "\n" + std::to_string(comm->device) + "\n" + std::to_string(comm->size);
  FileExchange::Outcome out;
  {
    std::lock_guard<std::mutex> lock(comm->exchangeMutex);
    out = comm->exchange->exchange(0, hello, [&] { return comm->aborted.load(); });
  }
  if (!out.all) {
    if (out.abortedPeer >= 0) comm->fail(ncclRemoteError, "init: peer rank " + std::to_string(out.abortedPeer) + " aborted");
    return;
  }
  for (int r = 0; r < comm->size; ++r) {
    const std::string& a = (*out.all)[static_cast<std::size_t>(r)];
    if (a.substr(a.rfind('\n') + 1) != std::to_string(comm->size)) {
      comm->fail(ncclInvalidUsage, "init: rank " + std::to_string(r) + " was initialized with a different nranks");
      return;
    }
    for (int q = r + 1; q < comm->size; ++q) {
      if (a == (*out.all)[static_cast<std::size_t>(q)]) {
        // NCCL's own words for two ranks of one communicator on one GPU.
        comm->fail(ncclInvalidUsage, "Duplicate GPU detected : rank " + std::to_string(r) + " and rank " +
                                         std::to_string(q) + " both on CUDA device " +
                                         a.substr(a.find('\n') + 1, a.rfind('\n') - a.find('\n') - 1));
        return;
      }
    }
  }
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (comm->state == ncclInProgress) comm->state = ncclSuccess;
}

// One collective as stream work on rank comm->rank.
void runCollective(const std::shared_ptr<Comm>& comm, long seq, Header header, const void* send, std::size_t sendBytes,
                   void* recv) {
  Runtime& rt = Runtime::get();
  Faults faults;
  {
    std::lock_guard<std::mutex> lock(rt.mutex());
    faults = rt.faults();
  }
  const std::string what = std::string(kindName(static_cast<Kind>(header.kind))) + " #" + std::to_string(seq) +
                           " on rank " + std::to_string(comm->rank);
  if (faults.appliesTo(comm->rank)) {
    for (long waited = 0; waited < faults.slowMs && !comm->aborted.load(); ++waited) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (faults.hangCollective == seq) return comm->waitAborted();  // DDPRUN_SIMGPU_HANG_COLLECTIVE
    if (faults.asyncErrorCollective == seq) {
      comm->fail(ncclRemoteError, "simgpu: injected asynchronous error (DDPRUN_SIMGPU_ASYNC_ERROR) in " + what);
      return comm->waitAborted();
    }
  }
  if (comm->aborted.load()) return;
  std::string payload(sizeof(Header) + sendBytes, '\0');
  std::memcpy(payload.data(), &header, sizeof(Header));
  if (sendBytes) std::memcpy(payload.data() + sizeof(Header), send, sendBytes);  // device memory, read now
  FileExchange::Outcome out;
  {
    std::lock_guard<std::mutex> lock(comm->exchangeMutex);
    out = comm->exchange->exchange(seq, payload, [&] { return comm->aborted.load(); });
  }
  if (!out.all) {
    if (out.abortedPeer >= 0) {
      comm->fail(ncclRemoteError, what + ": peer rank " + std::to_string(out.abortedPeer) + " aborted its communicator");
      comm->waitAborted();
    }
    return;
  }
  std::vector<const char*> data;
  for (int r = 0; r < comm->size; ++r) {
    const std::string& bytes = (*out.all)[static_cast<std::size_t>(r)];
    Header theirs;
    std::memcpy(&theirs, bytes.data(), sizeof(Header));
    if (std::memcmp(&theirs, &header, sizeof(Header)) != 0) {
      comm->fail(ncclInvalidUsage, what + ": rank " + std::to_string(r) + " issued a different collective " +
                                       "(kind, type, op, root or count differ)");
      return comm->waitAborted();
    }
    data.push_back(bytes.data() + sizeof(Header));
  }
  const auto type = static_cast<ncclDataType_t>(header.type);
  const std::size_t elem = elementBytes(type);
  const std::size_t count = header.count;
  switch (static_cast<Kind>(header.kind)) {
    case Kind::kAllReduce:
      reduce(type, static_cast<ncclRedOp_t>(header.op), {data.begin(), data.end()}, count, recv);
      break;
    case Kind::kBroadcast:
      std::memcpy(recv, data[static_cast<std::size_t>(header.root)], count * elem);
      break;
    case Kind::kAllGather:
      for (int r = 0; r < comm->size; ++r) {
        std::memcpy(static_cast<char*>(recv) + static_cast<std::size_t>(r) * count * elem,
                    data[static_cast<std::size_t>(r)], count * elem);
      }
      break;
    case Kind::kReduceScatter: {
      std::vector<const void*> blocks;
      for (const char* d : data) blocks.push_back(d + static_cast<std::size_t>(comm->rank) * count * elem);
      reduce(type, static_cast<ncclRedOp_t>(header.op), blocks, count, recv);
      break;
    }
  }
}

const char* pointerProblem(PointerCheck check) {
  switch (check) {
    case PointerCheck::kHostPointer: return "is not device memory (a host pointer?)";
    case PointerCheck::kFreed: return "was freed";
    case PointerCheck::kOutOfRange: return "runs past the end of its allocation";
    case PointerCheck::kWrongDevice: return "belongs to another device than the communicator's";
    case PointerCheck::kOk: break;
  }
  return "";
}

ncclResult_t collective(Kind kind, const void* send, void* recv, std::size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t handle, cudaStream_t stream) {
  const char* name = kindName(kind);
  auto comm = live(handle, name);
  if (!comm) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->state == ncclInProgress && !comm->finalizing) {
      comm->lastError = std::string(name) + ": the communicator is still initializing (poll ncclCommGetAsyncError)";
      return ncclInvalidUsage;
    }
    if (comm->finalizing) {
      comm->lastError = std::string(name) + ": the communicator is being finalized";
      return ncclInvalidUsage;
    }
    if (comm->state != ncclSuccess) return comm->state;
  }
  const std::size_t elem = elementBytes(type);
  if (elem == 0) return usage(ncclInvalidArgument, std::string(name) + ": unsupported data type", comm.get());
  if ((kind == Kind::kAllReduce || kind == Kind::kReduceScatter) && !validOp(op)) {
    return usage(ncclInvalidArgument, std::string(name) + ": invalid reduction operation", comm.get());
  }
  if (kind == Kind::kBroadcast && (root < 0 || root >= comm->size)) {
    return usage(ncclInvalidArgument, std::string(name) + ": invalid root " + std::to_string(root), comm.get());
  }
  Runtime& rt = Runtime::get();
  rt.touch(comm->ordinal);
  auto s = rt.stream(stream);
  if (!s) return usage(ncclInvalidArgument, std::string(name) + ": invalid CUDA stream", comm.get());
  if (s->device != comm->device) {
    return usage(ncclInvalidArgument, std::string(name) + ": the stream belongs to device " + std::to_string(s->device) +
                                          ", the communicator to device " + std::to_string(comm->device), comm.get());
  }
  const std::size_t n = static_cast<std::size_t>(comm->size);
  std::size_t sendBytes = count * elem, recvBytes = count * elem;
  if (kind == Kind::kAllGather) recvBytes *= n;
  if (kind == Kind::kReduceScatter) sendBytes *= n;
  if (kind == Kind::kBroadcast && comm->rank != root) sendBytes = 0;
  if (count > 0) {
    if (sendBytes > 0) {
      if (PointerCheck c = rt.checkDevice(send, sendBytes, comm->device); c != PointerCheck::kOk) {
        return usage(ncclInvalidArgument, std::string(name) + " : sendbuff " + pointerProblem(c), comm.get());
      }
    }
    if (PointerCheck c = rt.checkDevice(recv, recvBytes, comm->device); c != PointerCheck::kOk) {
      return usage(ncclInvalidArgument, std::string(name) + " : recvbuff " + pointerProblem(c), comm.get());
    }
  }
  Header header{static_cast<int>(kind), static_cast<int>(type), static_cast<int>(op), root, count};
  std::lock_guard<std::mutex> lock(comm->mutex);
  const long seq = ++comm->issued;
  comm->lastTask = rt.enqueue(*s, [comm, seq, header, send, sendBytes, recv] {
    runCollective(comm, seq, header, send, sendBytes, recv);
  });
  return ncclSuccess;
}

// Waits until every collective issued so far ran, or the communicator was aborted.
void drain(const std::shared_ptr<Comm>& comm) {
  TaskPtr last;
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    last = comm->lastTask;
  }
  while (last && !Runtime::get().isDone(last) && !comm->aborted.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

}  // namespace simgpu

using simgpu::Comm;
using simgpu::Runtime;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  // DDPRUN_SIMGPU_NCCL_VERSION: pretend to be another NCCL (a version code, e.g. 21304).
  const char* pretend = std::getenv("DDPRUN_SIMGPU_NCCL_VERSION");
  *version = pretend && *pretend ? std::atoi(pretend) : NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  // As NCCL's: the text stays valid until the next failing call; not thread-safe.
  static thread_local std::string text;
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->comm->mutex);
    text = comm->comm->lastError;
  } else {
    std::lock_guard<std::mutex> lock(simgpu::globalErrorMutex);
    text = simgpu::globalLastError;
  }
  return text.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return ncclInvalidArgument;
  const char* base = std::getenv("DDPRUN_SIMGPU_DIR");
  if (!base || !*base) base = std::getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  static std::atomic<long> serial{0};
  std::random_device random;
  const std::string dir = std::string(base) + "/simgpu-nccl-" + std::to_string(getpid()) + "-" +
                          std::to_string(++serial) + "-" + std::to_string(random());
  const std::string id = simgpu::kIdMagic + dir;
  if (id.size() >= sizeof(uniqueId->internal)) {
    return simgpu::usage(ncclInternalError, "ncclGetUniqueId: the folder name is too long for an id: " + dir);
  }
  std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
  std::memcpy(uniqueId->internal, id.data(), id.size());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  if (!newcomm) return simgpu::usage(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *newcomm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return simgpu::usage(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                                  std::to_string(nranks) + " is invalid");
  }
  const std::string id(commId.internal, strnlen(commId.internal, sizeof(commId.internal)));
  if (id.rfind(simgpu::kIdMagic, 0) != 0) {
    return simgpu::usage(ncclInvalidArgument, "ncclCommInitRank: the id did not come from (simgpu's) ncclGetUniqueId");
  }
  Runtime& rt = Runtime::get();
  if (rt.deviceCount() == 0) return simgpu::usage(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device");
  auto comm = std::make_shared<Comm>();
  comm->rank = rank;
  comm->size = nranks;
  comm->ordinal = rt.contextDevice();  // NCCL uses the calling thread's current device
  comm->device = rt.physical(comm->ordinal);
  comm->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  comm->exchange = std::make_unique<simgpu::FileExchange>(id.substr(sizeof(simgpu::kIdMagic) - 1), rank, nranks);
  auto* handle = new ncclComm;
  handle->comm = comm;
  *newcomm = handle;
  if (comm->blocking) {
    simgpu::runInit(comm);
    std::lock_guard<std::mutex> lock(comm->mutex);
    return comm->state;
  }
  std::thread([comm] { simgpu::runInit(comm); }).detach();
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* asyncError) {
  auto comm = simgpu::live(handle, "ncclCommGetAsyncError");
  if (!comm || !asyncError) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lock(comm->mutex);
  *asyncError = comm->state;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t handle, int* count) {
  auto comm = simgpu::live(handle, "ncclCommCount");
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t handle, int* device) {
  auto comm = simgpu::live(handle, "ncclCommCuDevice");
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->ordinal;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t handle, int* rank) {
  auto comm = simgpu::live(handle, "ncclCommUserRank");
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

// Flushes every collective issued; non-blocking: ncclInProgress until they all ran.
ncclResult_t ncclCommFinalize(ncclComm_t handle) {
  auto comm = simgpu::live(handle, "ncclCommFinalize");
  if (!comm) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->finalizing) return simgpu::usage(ncclInvalidUsage, "ncclCommFinalize: called twice");
    if (comm->state != ncclSuccess) return comm->state;
    comm->finalizing = true;
    comm->state = ncclInProgress;
  }
  auto finish = [comm] {
    simgpu::drain(comm);
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->state == ncclInProgress) comm->state = ncclSuccess;
  };
  if (comm->blocking) {
    finish();
    std::lock_guard<std::mutex> lock(comm->mutex);
    return comm->state;
  }
  std::thread(finish).detach();
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t handle) {
  if (!handle) return ncclSuccess;
  auto comm = simgpu::live(handle, "ncclCommDestroy");
  if (!comm) return ncclInvalidArgument;
  simgpu::drain(comm);  // without ncclCommFinalize, destroy finalizes (and blocks) itself
  handle->dead = true;
  comm->exchange->leave();
  return ncclSuccess;
}

// Ends every collective of the communicator (hung ones included) and frees it; never waits for
// a peer. The peers see it as a remote error in their pending collectives.
ncclResult_t ncclCommAbort(ncclComm_t handle) {
  if (!handle) return ncclSuccess;
  auto comm = simgpu::live(handle, "ncclCommAbort");
  if (!comm) return ncclInvalidArgument;
  handle->dead = true;
  comm->aborted = true;
  comm->exchange->markAborted();
  comm->exchange->leave();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return simgpu::collective(simgpu::Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return simgpu::collective(simgpu::Kind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return simgpu::collective(simgpu::Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return simgpu::collective(simgpu::Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

}  // extern "C"
