// A cgroup v2 of the job's own, where the workers and everything they start live: ending it with
// cgroup.kill reaches processes that left the worker's process group (setsid) and dropped
// ddprun's marker variable (env -i), which nothing else can find. Used where the agent may create
// a cgroup under its own (root, or a delegated subtree); elsewhere the agent falls back to process
// groups, the subreaper and the marker scan (README, "Supervision").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun {

class JobCgroup {
 public:
  // Creates `name` under this process's own cgroup v2 (a hybrid system's "unified" mount too).
  // nullptr, with the reason in `why`, when there is no cgroup v2, it lacks cgroup.kill (Linux
  // < 5.14), or this process may not create or join cgroups there.
  static std::unique_ptr<JobCgroup> create(const std::string& name, std::string* why);
  // Kills what is left and removes the cgroup (bounded wait for it to empty).
  ~JobCgroup();
  JobCgroup(const JobCgroup&) = delete;
  JobCgroup& operator=(const JobCgroup&) = delete;

  // Open for writing: a child writes "0" to it between fork and exec to move itself in
  // (write(2) is async-signal-safe).
  int procsFd() const { return procs_.get(); }
  // Where the next child starts with CLONE_INTO_CGROUP, without the cost of a migration
  // (agent/worker_spawn.h), as an open directory; -1 when none can be made (then children move in
  // through procsFd()). The job cgroup itself until kill() was called; after that a new leaf
  // cgroup inside it, because Linux (6.18 here) SIGKILLs every child cloned into a cgroup that was
  // ever killed with cgroup.kill. Leaves are inside the job cgroup: kill() and the watchdog's kill
  // reach them.
  int spawnDirFd();
  // SIGKILLs every process in the cgroup and its leaves at once (cgroup.kill).
  void kill();
  // Whether no process is left in it (cgroup.events).
  bool empty() const;
  const std::string& path() const { return path_; }

 private:
  JobCgroup(std::string path, UniqueFd dir, UniqueFd procs)
      : path_(std::move(path)), dir_(std::move(dir)), procs_(std::move(procs)) {}

  std::string path_;
  UniqueFd dir_;
  UniqueFd procs_;
  bool killed_ = false;               // since the current spawn directory was chosen
  int generation_ = 0;
  UniqueFd leafDir_;                  // the current leaf, once the job cgroup was killed
  std::vector<std::string> leaves_;   // every leaf made (removed before the job cgroup)
};

}  // namespace ddprun
