// What ddprun exits with, where a scheduler reads it (README, "Exit status"; DESIGN §6). One place,
// so that the launcher, the agent and the rendezvous client cannot disagree.
#pragma once

namespace ddprun {

inline constexpr int kExitSuccess = 0;
// ddprun could not run the job on this node for a local reason (a folder it needs cannot be made).
inline constexpr int kExitCouldNotRun = 1;
// Bad command line or configuration, including a configuration the rendezvous refused.
inline constexpr int kExitUsage = 2;
// The first failure was a hung rank (--hang_timeout), as timeout(1) reports.
inline constexpr int kExitHung = 124;
// The cluster failed this node, not the program: the rendezvous unreachable or lost, the node
// fenced out and unable to join again, too few nodes within the join timeout. Above every
// 128+signal status (signals end at 64 on Linux) and below 255, so that schedulers that retry
// 128-255 (Kubeflow, a podFailurePolicy) retry it and nobody mistakes it for a signal.
inline constexpr int kExitInfrastructure = 200;
// This node was excluded from the job (--exclude_node_after: its workers caused that many
// failures); the job goes on without it, and its host is refused for the job's life. Not 200: a
// scheduler must not put it back in blindly. Kubeflow's ExitCode policy still restarts 128-255;
// such an agent is refused within milliseconds, starting nothing, so a retry costs nothing but a
// pod (README "Exit status": match 201 in a podFailurePolicy, and drain the node).
inline constexpr int kExitExcluded = 201;

}  // namespace ddprun
