// Job cgroups nobody will remove: when an agent and its watchdog die together (kill -9 of the
// whole tree, the OOM killer), the agent's empty `ddprun-*` cgroup stays behind, one per job, for
// ever. A live agent holds an flock on its job cgroup's directory from the moment it made it until
// it removes it (ownJobCgroup); a sibling that nobody holds and no process populates has no owner
// left, and the next watchdog started beside it removes it (sweepStaleJobCgroups). Used by the
// agent and by ddprun-watchdog, so it depends on nothing but libc and the standard library.
#pragma once

#include <string>

namespace ddprun::cgroup {

// Opens the directory `path`, just made by mkdir, and takes its owner's lock. Returns the open
// directory (close-on-exec; the lock lasts while it is open), or -1 when it is gone: a sweep
// removed it between mkdir and the lock, and the caller makes it again.
int ownJobCgroup(const std::string& path);

// Removes the (empty) cgroups directly inside `path`: a cgroup with children cannot be removed.
void removeLeaves(const std::string& path);

// Removes every cgroup named ddprun-* beside `jobCgroup` (in its parent) that no agent holds
// and no process is in. Returns how many were removed.
int sweepStaleJobCgroups(const std::string& jobCgroup);

}  // namespace ddprun::cgroup
