// How simulated NCCL ranks in different processes meet (internal to libsimgpu): a folder named in
// the ncclUniqueId. For step `seq` each rank writes its bytes to "s<seq>.r<rank>" (written aside,
// then renamed, so a reader never sees half a file) and polls until every rank's file is there.
// A rank removes its file of step seq - 1 once step seq is complete (every peer has read it by
// then); "abort.<rank>" marks an aborted peer; the last rank to leave removes the folder.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace simgpu {

class FileExchange {
 public:
  FileExchange(std::string dir, int rank, int size);

  struct Outcome {
    std::optional<std::vector<std::string>> all;  // every rank's bytes, by rank
    int abortedPeer = -1;                           // set when a peer aborted instead
  };
  // Publishes `mine` for step `seq` and waits for every rank's bytes; gives up, returning
  // neither, as soon as stop() is true.
  Outcome exchange(long seq, const std::string& mine, const std::function<bool()>& stop);
  // Tells the peers that this rank aborted.
  void markAborted();
  // This rank is done with the folder; the last one out removes it.
  void leave();

 private:
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string dir_;
  const int rank_;
  const int size_;
  long lastSeq_ = -1;
};

}  // namespace simgpu
