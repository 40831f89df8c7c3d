#include "agent/hang_attribution.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>

#include "common/flight_record.h"
#include "common/unique_fd.h"

namespace ddprun {
namespace {

std::string listRanks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string named(const CollectiveRecord& r) { return r.op + " #" + std::to_string(r.seq); }

std::string sizeText(uint64_t bytes) {
  if (bytes >= (1u << 20)) return fmt::format("{:.1f} MB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KB", static_cast<double>(bytes) / 1024);
  return fmt::format("{} B", bytes);
}

}  // namespace

std::optional<std::vector<CollectiveRecord>> readFlightRecorder(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != static_cast<off_t>(sizeof(flight::File))) {
    return std::nullopt;
  }
  // A copy, not a mapping: the worker goes on writing while this reads.
  auto file = std::make_unique<flight::File>();
  std::size_t done = 0;
  auto* bytes = reinterpret_cast<char*>(file.get());
  while (done < sizeof(flight::File)) {
    ssize_t n = ::pread(fd.get(), bytes + done, sizeof(flight::File) - done, static_cast<off_t>(done));
    if (n <= 0) return std::nullopt;
    done += static_cast<std::size_t>(n);
  }
  if (file->magic != flight::kMagic) return std::nullopt;
  // Re-read each slot's seq from the file after the copy: a slot rewritten meanwhile is dropped.
  std::vector<CollectiveRecord> out;
  for (uint32_t i = 0; i < flight::kCapacity; ++i) {
    const flight::Entry& e = file->entries[i];
    if (e.seq == 0) continue;
    uint64_t again = 0;
    if (::pread(fd.get(), &again, sizeof(again),
                static_cast<off_t>(offsetof(flight::File, entries) + i * sizeof(flight::Entry))) != sizeof(again) ||
        again != e.seq) {
      continue;
    }
    CollectiveRecord r;
    r.seq = e.seq;
    r.op.assign(e.op, strnlen(e.op, sizeof(e.op)));
    for (char& c : r.op) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    r.bytes = e.bytes;
    r.completed = e.state == static_cast<uint32_t>(flight::State::kCompleted);
    r.failed = e.state == static_cast<uint32_t>(flight::State::kFailed);
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  return out;
}

HangAttribution attributeHang(const std::vector<RankCollectives>& ranks) {
  const CollectiveRecord* front = nullptr;  // the furthest collective any rank started
  for (const auto& r : ranks) {
    if (!r.records.empty() && (!front || r.records.back().seq > front->seq)) front = &r.records.back();
  }
  if (!front) return {};
  std::vector<int> behind, inIt, done, none;
  std::map<int, const CollectiveRecord*> lastOf;
  for (const auto& r : ranks) {
    if (r.records.empty()) {
      none.push_back(r.rank);
      continue;
    }
    const CollectiveRecord& last = r.records.back();
    lastOf[r.rank] = &last;
    if (last.seq < front->seq) {
      behind.push_back(r.rank);
    } else if (!last.completed) {
      inIt.push_back(r.rank);
    } else {
      done.push_back(r.rank);
    }
  }
  behind.insert(behind.end(), none.begin(), none.end());
  std::sort(behind.begin(), behind.end());
  if (!behind.empty()) {
    std::string line = listRanks(behind) + " never started " + named(*front);
    if (behind.size() == 1 && lastOf.count(behind[0])) {
      const CollectiveRecord& last = *lastOf[behind[0]];
      line += " (its last: " + named(last) + (last.completed ? ", completed)" : ", not completed)");
    }
    if (!inIt.empty()) line += "; " + listRanks(inIt) + (inIt.size() == 1 ? " waits" : " wait") + " in it";
    if (!done.empty()) line += "; " + listRanks(done) + " completed it";
    return {line, behind};
  }
  if (!inIt.empty()) {
    std::string line = listRanks(inIt) + (inIt.size() == 1 ? " is" : " are all") + " in " + named(*front) +
                       " and none of them completed it: the rank holding it back is on another node, or the " +
                       "transport is stuck";
    if (!done.empty()) line += "; " + listRanks(done) + " completed it";
    return {line, {}};
  }
  return {"every rank here completed its last collective (" + named(*front) +
         "): the hang is outside communication", {}};
}

std::string describeRecent(const RankCollectives& rank, std::size_t n) {
  std::string out = "rank " + std::to_string(rank.rank) + ":";
  if (rank.records.empty()) return out + " no collective";
  const std::size_t from = rank.records.size() > n ? rank.records.size() - n : 0;
  for (std::size_t i = from; i < rank.records.size(); ++i) {
    const auto& r = rank.records[i];
    out += (i == from ? " " : ", ") + ("#" + std::to_string(r.seq)) + " " + r.op + " " + sizeText(r.bytes) + " " +
           (r.completed ? "completed" : r.failed ? "failed" : "started");
  }
  return out;
}

namespace {

// A frame of torch's collectives (faulthandler: `  File "/.../torch/distributed/distributed_c10d.py",
// line 1436 in all_reduce`): the rank waits there for the others.
bool inCollective(const std::vector<std::string>& lines) {
  for (const auto& line : lines) {
    if (line.find("/torch/distributed/") != std::string::npos ||
        line.find("/torch/nn/parallel/distributed.py") != std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

HangAttribution attributeFromStacks(const std::vector<RankStackLines>& stacks) {
  std::vector<int> outside, waiting;
  for (const auto& s : stacks) {
    if (s.lines.empty()) continue;
    (inCollective(s.lines) ? waiting : outside).push_back(s.rank);
  }
  if (outside.size() != 1 || waiting.empty()) return {};
  std::sort(waiting.begin(), waiting.end());
  return {"rank " + std::to_string(outside[0]) + " is outside every torch.distributed call while " + listRanks(waiting) +
              (waiting.size() == 1 ? " waits" : " wait") + " in one: rank " + std::to_string(outside[0]) +
              " is the one behind",
          outside};
}

}  // namespace ddprun
