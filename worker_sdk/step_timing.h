// The compute time of a rank's last synchronized step, as GradientReducer::finish() measures it:
// from the end of the previous finish() to the start of this one, which is the rank's own work
// (data, forward, backward, the optimizer) and not the wait for slower peers, which in a data-
// parallel job is the same for every rank. Heartbeat::beat() sends it to the agent with the next
// beat ("time=SECONDS"), where stragglers are found (agent/straggler_detector.h). Process-wide.
#pragma once

#include <optional>

namespace ddp::detail {

void noteStepCompute(double seconds) noexcept;
// The mean of the values noted since the last call (steps a heartbeat skipped included); nothing
// when none was.
std::optional<double> takeStepCompute() noexcept;

}  // namespace ddp::detail
