#include "tests/simgpu/exchange.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace simgpu {

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string readFile(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void writeFile(const std::string& p, const std::string& bytes) {
  const std::string tmp = p + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::rename(tmp.c_str(), p.c_str());
}

std::string stepFile(long seq, int rank) { return "s" + std::to_string(seq) + ".r" + std::to_string(rank); }

}  // namespace

FileExchange::FileExchange(std::string dir, int rank, int size) : dir_(std::move(dir)), rank_(rank), size_(size) {
  ::mkdir(dir_.c_str(), 0700);  // every rank tries; one makes it
}

FileExchange::Outcome FileExchange::exchange(long seq, const std::string& mine, const std::function<bool()>& stop) {
  writeFile(path(stepFile(seq, rank_)), mine);
  std::vector<bool> seen(static_cast<std::size_t>(size_), false);
  int missing = size_;
  int round = 0;
  while (missing > 0) {
    for (int r = 0; r < size_; ++r) {
      if (!seen[static_cast<std::size_t>(r)] && exists(path(stepFile(seq, r)))) {
        seen[static_cast<std::size_t>(r)] = true;
        --missing;
      }
    }
    if (missing == 0) break;
    if (stop()) return {};
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && !seen[static_cast<std::size_t>(r)] && exists(path("abort." + std::to_string(r)))) {
        return Outcome{std::nullopt, r};
      }
    }
    // Short sleeps first (peers usually arrive within microseconds), then at most 1 ms.
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 << std::min(round++, 7))));
  }
  Outcome outcome;
  outcome.all.emplace();
  for (int r = 0; r < size_; ++r) outcome.all->push_back(readFile(path(stepFile(seq, r))));
  // Every rank wrote step seq, so every rank finished reading step seq - 1.
  if (lastSeq_ >= 0) ::unlink(path(stepFile(lastSeq_, rank_)).c_str());
  lastSeq_ = seq;
  return outcome;
}

void FileExchange::markAborted() { writeFile(path("abort." + std::to_string(rank_)), ""); }

void FileExchange::leave() {
  writeFile(path("bye." + std::to_string(rank_)), "");
  for (int r = 0; r < size_; ++r) {
    if (!exists(path("bye." + std::to_string(r)))) return;
  }
  // Every rank left: nobody reads here any more (a peer that left wrote its bye after its reads).
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace simgpu
